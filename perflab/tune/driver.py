"""The tune loop: measure and diagnose the best so far, try the ranked levers, keep what is proven, repeat.

    measure start -> profile + diagnose -> for each proposed lever (a value search for numeric knobs):
        trial = best + lever, measured in its own process with the quality gate on
        compare(best, trial) accepts and the constraints hold -> keep it (best = trial), re-profile
        otherwise -> the lever lost; it is not tried again
    until no lever wins, the budget or --max-trials is spent, or the GPU is busy with MFU near the peak.

The round's steps are their own modules: the profile and its diagnosis (profiling.py), a candidate's trial
(candidate_trials.py), the two-stage round (screening.py), the budget and --max-trials (limits.py), and what the
search knows between trials (search_state.py).

With --objective max-qps a measured trial (the start, each candidate) is `perflab serve --find-max-qps` and is
judged by its max QPS (perflab/tune/objective.py); the profiles behind the diagnosis stay `perflab profile` of
the inference step at the max batch, so the levers are still ranked from where the step's time goes. Once no
model lever is left, the serve settings that the best trial's own inference-queue diagnosis proposes (max batch,
batch timeout, instances, bucket step: perflab.diagnose.inference_queue.setting_changes) are tried the same way.

Every trial is one row of tune.jsonl written before the next begins (perflab/tune/record.py); on --resume the loop
replays and reuses the recorded rows (its choices depend only on them), so nothing is lost and nothing is run twice.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from perflab import options
from perflab.config import RunConfig
from perflab.bottlenecks import INFERENCE_QUEUE
from perflab.errors import PerflabError
from perflab.levers import all_levers
from perflab.tune import candidates as search
from perflab.tune import ordering
from perflab.tune.budget import Budget
from perflab.tune.candidate_trials import CandidateTrials, trial_judge
from perflab.tune.candidates import WorkloadBuilds, usable_cpus
from perflab.tune.decision import unjudged_line
from perflab.serve.config import ServeConfig
from perflab.tune.objective import SERVE, serve_record
from perflab.tune.journal import Journal, trial_key
from perflab.tune.limits import SearchStopped, TrialLimits
from perflab.tune.memory_trade import checkpointed_batch, trade_verdict
from perflab.tune.profiling import SHORT_PROFILE_STEPS, Diagnoser, Profiler, diagnose_trace, profile_steps
from perflab.tune.record import TRIALS_DIR, Runner, TrialRecorder, TrialRequest
from perflab.tune.rows import MemoryTrade, TrialRow
from perflab.tune.screening import Screener, start_noise_pct, win_threshold_pct
from perflab.tune.search_state import SearchState
from perflab.tune.settings import MAX_QPS, TuneConfig
from perflab.tune.start import start_notes, start_trial_config
from perflab.tune.stop import StopContext, StopKind, StopReason, stop_line
from perflab.tune.trial import OOM, run_trial
from perflab.diagnose.inference_queue import setting_changes

# SearchStopped, SHORT_PROFILE_STEPS and profile_steps are re-exported: they were defined here before limits.py and
# profiling.py held them
__all__ = ["Tuner", "TuneObserver", "SearchStopped", "SHORT_PROFILE_STEPS", "profile_steps"]

SERVE_SETTING = "serve-setting"  # the search kind of a serve-settings candidate (max-qps objective)
CHECKPOINTING = "activation-checkpointing"  # the lever that trades memory for a larger batch (memory_trade.py)

BATCH_LIMIT = 4096
BATCH_NOTE = ("batch size changes the optimisation (the learning rate and schedule were tuned for the old batch): "
              "re-check convergence before adopting it")
NO_LEVER_WON = "every proposed lever was tried, refused or lost"
NO_SETTING_WON = "every proposed lever and every setting the queue diagnosis proposed was tried, refused or lost"
# A round that found no win over a start that moves more than a screen must show is screened once more with trials
# this many times as long (a mean's noise falls about as the root of its length): on an H200 a planted nonzero
# router's start moved 28-41% and tune stopped "inconclusive" after 36 s of a 120-s budget.
STEADIER_TRIALS = 3.0


class TuneObserver:
    """Progress callbacks; the CLI draws a live table from them, the library ignores them."""

    def trial_started(self, name: str, kind: str) -> None:
        pass

    def trial_finished(self, row: TrialRow, reused: bool) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class Tuner:
    """One tune directory being filled. `runner` runs a trial (a subprocess by default) and `diagnoser` reads a
    profile's trace; tests pass fakes of both to check the search without processes."""

    def __init__(self, start: RunConfig, settings: TuneConfig, out: Path, runner: Runner = run_trial,
                 observer: Optional[TuneObserver] = None, cpu_count: Optional[int] = None,
                 workload: Any = None, check_workload: bool = True, diagnoser: Diagnoser = diagnose_trace,
                 screening: bool = True):
        self.settings = settings.validate()
        # Resolved (device, batch) by the start trial's own process: resolving here would create a CUDA context
        # in this process, which every trial would see as a neighbour on its GPU.
        start = start.replace(out=None).validate()
        settings.check_start(start)
        self.state = SearchState(start, best_cfg=start, serve_cfg=settings.serve)
        self.measure = SERVE if settings.objective == MAX_QPS else "run"  # the kind of a measured trial
        self.out = Path(out)
        self.observer = observer or TuneObserver()
        self.cpu_count = cpu_count or usable_cpus()
        self.levers = {lever.name: lever for lever in all_levers()}
        self.workloads = WorkloadBuilds(start, workload, check_workload and workload is None)
        (self.out / TRIALS_DIR).mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.out, settings.resume)
        self.journal.check_same_start(start_trial_config(start), self.measure)
        self.budget = Budget(settings.budget_s)
        self.recorder = TrialRecorder(self.out, self.journal, self.budget, runner, self.observer,
                                      trial_judge(self.settings, self.measure))
        self.limits = TrialLimits(self.budget, settings.max_trials, lambda: self.recorder.count)
        self.profiler = Profiler(self.out, self.recorder, self.budget, diagnoser, self.levers, self.state.notes,
                                 self.observer)
        self.trials = CandidateTrials(self.state, self.settings, self.measure, self.levers, self.workloads,
                                      self.recorder, self.budget, self.observer, self.profiler.verdict)
        # Two stages (perflab/tune/screening.py) for the throughput objective; max-qps, or screening=False, tries
        # each candidate in full at once.
        self.screener = Screener(self.trials, self.limits, self.profiler, self.cpu_count) \
            if screening and self.measure == "run" else None
        self.tried_settings: set[str] = set()
        self.stopped: Optional[StopReason] = None
        self.steadied = False  # the steadier pass ran (once a tune)

    # ------------------------------------------------------------------------------------------ the loop

    @property
    def count(self) -> int:
        """Trials recorded so far (reused ones included)."""
        return self.recorder.count

    @property
    def spent_s(self) -> float:
        return self.budget.spent_s

    def run(self) -> str:
        """Tune until a stop condition; returns the stop line (why, and what was kept, screened or left)."""
        self.budget.start()
        self.stopped = self._run()
        return self.stop_line(self.stopped)

    def stop_line(self, reason: StopReason) -> str:
        """The stop line: the reason, and what the best, the kept levers and the unconfirmed wins are."""
        state = self.state
        context = StopContext(
            best_label=state.best_row.label if state.best_row is not None else None,
            kept=[row.label for row in state.chain if row.kept], advice=self.profiler.advice(),
            unconfirmed=[win.describe() for win in state.unconfirmed], noise=self._noise(),
            profile_cut=self.profiler.profile_cut, unjudged=unjudged_line([row.decision for row in state.chain]))
        return stop_line(reason, context)

    def _noise(self) -> Optional[str]:
        """Why 'no lever won' is no verdict: the start's own throughput moves more than the gain a screen must show
        (None when it holds still, or nothing says)."""
        if self.screener is None or self.state.baseline_row is None:
            return None
        noise = start_noise_pct(self.state.baseline_row, self.screener.references)
        threshold = win_threshold_pct(self.settings.min_effect_pct)
        if noise is None or noise <= threshold:
            return None
        return (f"but the starting point's own throughput moves {noise:.0f}% from one measurement to the next, more "
                f"than the +{threshold:g}% a screen must show, so a lever's gain of that size cannot be told from the "
                "noise; steady the step first (what varies: `perflab profile`) or give each trial longer "
                "(--min-trial-s)")

    def _run(self) -> StopReason:
        self._measure_start()
        try:
            while True:
                self.limits.check()
                self._check_room_for_a_round()
                self.profiler.profile_and_diagnose(self.state.best_cfg, self.state.best_row, self.state.lost)
                if self.profiler.near_peak(self.state.best):
                    return StopReason(StopKind.NEAR_PEAK, "the GPU is busy and MFU is near the calibrated peak; "
                                                          "nothing left to win")
                trials_before = self.count
                if not self._try_levers():
                    if self.measure == SERVE and self._try_serve_settings():
                        continue
                    if self.count == trials_before:
                        return self._nothing_to_try()
                    if self.measure == SERVE:
                        return StopReason(StopKind.NO_SETTING_WON, NO_SETTING_WON)
                    if self._steadier_pass():
                        continue
                    return StopReason(StopKind.NO_LEVER_WON, NO_LEVER_WON)
        except SearchStopped as stop:
            return stop.reason

    def _steadier_pass(self) -> bool:
        """Once a tune, when no lever won over a start that moves more than a screen must show and nothing was
        kept: the levers whose screens lost are screened again with trials STEADIER_TRIALS times as long, where
        the budget left holds a longer reference and one longer screen (else the stop stays "inconclusive", with
        the noise it read). False when it does not apply."""
        screener = self.screener
        if screener is None or self.steadied or self.state.best_row is not self.state.baseline_row:
            return False
        noise = start_noise_pct(self.state.baseline_row, screener.references)
        if self._noise() is None or screener.reference is None:
            return False
        reopened = screener.lost_in_screens()
        if not reopened or self.budget.left_s() < 2 * STEADIER_TRIALS * screener.reference.wall_s:
            return False
        self.steadied = True
        screener.lengthen(STEADIER_TRIALS, reopened)
        note = (f"the start moved {noise:.0f}% between measurements, more than a screen's +"
                f"{win_threshold_pct(self.settings.min_effect_pct):g}%: {', '.join(reopened)} screened again with "
                f"trials {STEADIER_TRIALS:g}x as long")
        self.state.notes.append(note)
        self.observer.note(note)
        return True

    def _start_trial_config(self) -> RunConfig:
        return start_trial_config(self.state.start)

    def _measure_start(self) -> None:
        """The starting point's full trial: the first best, and the baseline every gain is read against."""
        record = self.trials.record(TrialRequest(self._start_trial_config(), self.measure, "start",
                                                 time_limit_s=self.budget.left_s()))
        self.state.notes.extend(start_notes(record, self.settings, self.measure, self.out))
        # device and batch resolved; the user's own --check-quality kept (the recipe carries it, not the trial's)
        start = record.result.config.run_config().replace(out=None, check_quality=self.state.start.check_quality)
        self.workloads.start = start
        self.state.started(start, record)

    def adopt_recorded_start(self) -> None:
        """After Ctrl-C: a start already in tune.jsonl becomes the best even where the interrupt came between its row
        and its taking as the best (read back from its row, as --resume does; nothing runs)."""
        if self.state.best_row is not None:
            return
        key = trial_key(self._start_trial_config(), self.measure,
                        self.state.serve_cfg if self.measure == SERVE else None)
        row = self.journal.get(key)
        if row is None or not row.measured:
            return
        try:
            self._measure_start()
        except (PerflabError, SearchStopped, OSError):  # an unreadable start is no best: tune.json is not written
            return

    def _nothing_to_try(self) -> StopReason:
        """Why the search ends without a trial: the diagnosis's advice is what remains (e.g. remove a sync)."""
        diagnosis = self.profiler.diagnosis
        return StopReason(StopKind.NO_LEVER_LEFT, diagnosis.bottleneck if diagnosis is not None else "")

    def _check_room_for_a_round(self) -> None:
        """Stop before a re-profile when the budget left would not cover it and one trial after it (as long as
        the last ones took): a profile that no trial can follow only spends time."""
        last_profile_s = self.profiler.last_profile_s
        if last_profile_s is None:
            return
        left = self.budget.total_s - self.budget.spent_s
        trial_s = self.state.best_row.wall_s
        if self.screener is not None and self.screener.reference is not None:
            trial_s = 2 * self.screener.reference.wall_s  # a round: a reference and one screen at least
        if left < last_profile_s + trial_s:
            self.limits.stop(StopReason(StopKind.BUDGET_NEARLY_SPENT,
                                        f"{max(0.0, left):.0f} s left, less than a profile ({last_profile_s:.0f} s) "
                                        f"and one trial ({trial_s:.0f} s) take"))

    # ------------------------------------------------------------------------------------------ the search

    def _try_levers(self) -> bool:
        """Try the proposed levers in order until one is kept (True) or none is left (False)."""
        if self.screener is not None:
            if self.screener.round():
                return True
            if self.settings.tune_batch and search.BATCH_LEVER not in self.state.settled:
                return self._search_batch()
            return False
        arranged = ordering.arrange(self.profiler.proposals(), self.state.best_cfg)
        for proposal in arranged:
            if self._search_lever(proposal):
                partner = ordering.partner_of(proposal.lever)
                for other in arranged:  # its partner before re-profiling: the two are one win in two trials
                    if other.lever == partner:
                        self._search_lever(other)
                return True
        if self.settings.tune_batch and search.BATCH_LEVER not in self.state.settled:
            return self._search_batch()
        return False

    def _try_serve_settings(self) -> bool:
        """With --objective max-qps, once no model lever is left: each serve setting the best trial's own
        inference-queue diagnosis proposes (max batch, batch timeout, instances, bucket step), against the best;
        True when one was kept (the next round reads the new best's diagnosis)."""
        state = self.state
        for change in setting_changes(serve_record(state.best)):
            flag = options.option_named(ServeConfig, change.option).flag.lstrip("-")
            label = f"{flag}={change.value:g}" if isinstance(change.value, float) else f"{flag}={change.value}"
            if label in self.tried_settings:
                continue
            self.tried_settings.add(label)
            serve_cfg = dataclasses.replace(state.serve_cfg, **{change.option: change.value})
            try:
                serve_cfg.validate()
            except PerflabError as err:
                state.skipped[label] = str(err)
                continue
            self.limits.check()
            context = {"lever": flag, "label": label, "option": change.option, "value": change.value,
                       "search": SERVE_SETTING, "against": state.best_row.name, "bottleneck": INFERENCE_QUEUE,
                       "proposed_by": INFERENCE_QUEUE, "why_proposed": change.why}
            record = self.trials.record(TrialRequest(self.trials.trial_config(state.best_cfg), SERVE, label, context,
                                                     judge_against=state.best, time_limit_s=self.budget.left_s(),
                                                     serve_cfg=serve_cfg))
            state.chain.append(record.row)
            if record.kept:
                state.serve_cfg = serve_cfg
                state.best, state.best_row = record.result, record.row
                return True
        return False

    def _search_lever(self, proposal: search.Proposal) -> bool:
        """Search one proposed lever's values against the best so far; True when one was kept."""
        if proposal.lever in self.state.settled or proposal.lever in self.settings.exclude:
            return False
        candidates = search.expand(proposal, self.levers[proposal.lever], self.state.best_cfg, self.cpu_count)
        return bool(candidates) and self._search(candidates)

    def _search(self, candidates: list[search.Candidate]) -> bool:
        """Try a lever's values: a ladder climbs until LADDER_PATIENCE rungs in a row do not win; alternatives
        are each tried; a one-value lever once."""
        state = self.state
        kept_any = tried = measured = False
        misses = 0  # ladder rungs in a row that did not win
        lever = candidates[0].lever
        for candidate in candidates:
            if not self.trials.can_try(candidate):
                continue
            self.limits.check()
            kept, tried = self.trials.try_candidate(candidate), True
            kept_any = kept_any or kept
            measured = measured or state.chain[-1].judged and state.chain[-1].measured
            misses = 0 if kept else misses + 1
            if candidate.search == search.ONCE or candidate.search == search.LADDER and \
                    misses >= search.LADDER_PATIENCE:
                break
        if tried:
            state.settled.add(lever)
        if measured and not kept_any:  # refused, crashed or noisy trials are not losses: nothing was judged
            note = self.trials.retries.defer(lever, candidates[-1].search == search.ONCE, state.chain[-1])
            if note is None:
                state.lost.append(lever)
            else:
                state.notes.append(note)
        return kept_any

    def _search_batch(self) -> bool:
        """Grow the batch until it runs out of memory or stops paying, then bisect towards the OOM."""
        state = self.state
        if state.best_cfg.mode == "train" and BATCH_NOTE not in state.notes:
            state.notes.append(BATCH_NOTE)
        good, out_of_memory, kept_any = state.best_cfg.batch_size, None, False
        batch: Optional[int] = good * 2
        proposal = search.Proposal(search.BATCH_LEVER, "batch size (--tune-batch)", None, None)
        while batch is not None and batch <= BATCH_LIMIT:
            self.limits.check()
            candidate = search.Candidate(proposal, "batch_size", batch, search.BATCH)
            kept = self.trials.try_candidate(candidate)
            if kept:
                good, kept_any = batch, True
                batch = good * 2 if out_of_memory is None else search.bisect_batch(good, out_of_memory)
            elif state.chain[-1].status == OOM:
                out_of_memory = batch
                batch = search.bisect_batch(good, out_of_memory)
            else:
                break
        state.settled.add(search.BATCH_LEVER)  # searched: not again, whatever it kept
        if out_of_memory is not None:  # memory stopped the batch: checkpointing may buy a larger one
            kept_any = self._trade_memory_for_batch(good, out_of_memory) or kept_any
        return kept_any

    def _trade_memory_for_batch(self, good: int, out_of_memory: int) -> bool:
        """Activation checkpointing with the larger batch it allows (perflab/tune/memory_trade.py), tried as one
        candidate against the best; kept only when it wins. Its outcome, kept or why not, is a note."""
        state, lever = self.state, CHECKPOINTING
        if state.best_cfg.mode != "train" or state.best_cfg.activation_checkpointing \
                or lever in self.settings.exclude or lever in state.settled and lever not in state.lost:
            return False
        declared = self.levers[lever]  # its option and value, as the lever declares them
        proposal = search.Proposal(lever, "batch size (--tune-batch) ran out of memory", None, None)
        probe = search.Candidate(proposal, declared.option, declared.value, search.BATCH)
        if not self.trials.can_try(probe):  # the lever is refused here (no checkpointable blocks, inference)
            return False
        batch, basis = checkpointed_batch(state.best_cfg, good, out_of_memory)
        batch = min(batch, BATCH_LIMIT)
        label = f"{lever}+batch-size={batch}"
        if batch <= good:
            state.skipped[label] = f"checkpointing allows no batch above {good} ({basis})"
            self.observer.note(f"not trying {label}: {state.skipped[label]}")
            return False
        self.limits.check()
        pair = search.Candidate(proposal, declared.option, declared.value, search.BATCH, also=(("batch_size", batch),))
        trade = MemoryTrade(good, out_of_memory, batch, basis)
        kept = self.trials.try_candidate(pair, {"trade": trade.to_dict()})
        row = state.chain[-1]
        row.trade = trade  # its verdict, once judged, is tune.json's (tune.jsonl has the trade as it was tried)
        trade.verdict = trade_verdict(row, trade)
        state.notes.append(f"{trade.verdict}; {basis}")
        state.settled.add(lever)
        return kept

"""The tune loop: measure and diagnose the best so far, try the ranked levers, keep what is proven, repeat.

    measure start -> profile + diagnose -> for each proposed lever (a value search for numeric knobs):
        trial = best + lever, measured in its own process with the quality gate on
        compare(best, trial) accepts and the constraints hold -> keep it (best = trial), re-profile
        otherwise -> the lever lost; it is not tried again
    until no lever wins, the budget or --max-trials is spent, or the GPU is busy with MFU near the peak.

A profile gets at most PROFILE_SHARE of the budget (a step that launches thousands of kernels made one take 65 s of a
90-s budget); one cut at that limit leaves no diagnosis, and the round screens the insurance levers instead.

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
import inspect
from pathlib import Path
from typing import Any, Callable, Optional

from perflab import options
from perflab.config import RunConfig
from perflab.bottlenecks import INFERENCE_QUEUE
from perflab.errors import OutOfMemoryFailure, PerflabError
from perflab.oom import OutOfMemory
from perflab.levers import all_levers
from perflab.results import Result
from perflab.tune import candidates as search
from perflab.tune import ordering
from perflab.tune.budget import Budget
from perflab.tune.candidates import CompileCost, WorkloadBuilds, predicted_gain_pct, usable_cpus
from perflab.tune.decision import Decision, constraint_violations, judge, unjudged_line
from perflab.serve.config import ServeConfig
from perflab.tune.objective import SERVE, judge_max_qps, max_qps_of, serve_record, serve_refusal
from perflab.tune.journal import Journal
from perflab.tune.memory_trade import checkpointed_batch, trade_verdict
from perflab.tune.recipe import UnconfirmedWin
from perflab.tune.record import TRIALS_DIR, Runner, TrialRecord, TrialRecorder, TrialRequest
from perflab.tune.retry import NoiseRetries
from perflab.tune.rows import MemoryTrade, TrialRow
from perflab.tune.screening import Screener, insurance_proposals, start_noise_pct, win_threshold_pct
from perflab.tune.settings import MAX_QPS, TuneConfig, strict_tolerances
from perflab.tune.stop import StopContext, StopKind, StopReason, stop_line
from perflab.tune.summary import DiagnosisEntry
from perflab.tune.trial import OK, OOM, PROFILE_STEPS, QUALITY_FAIL, TIMEOUT, TrialOutcome, run_trial
from perflab.diagnose import diagnose
from perflab.diagnose.inference_queue import setting_changes

SERVE_SETTING = "serve-setting"  # the search kind of a serve-settings candidate (max-qps objective)
CHECKPOINTING = "activation-checkpointing"  # the lever that trades memory for a larger batch (memory_trade.py)

NEAR_PEAK_BUSY_PCT = 95.0
NEAR_PEAK_MFU_PCT = 70.0  # share of the calibrated peak that counts as "near it"
BATCH_LIMIT = 4096
# A profile trial may take this share of the budget: on an H200, 600 small tensors updated by Adam(foreach=False)
# launched 6,900 kernels a step, and the start's profile ran 65 s of a 90-s budget, leaving nothing to try.
PROFILE_SHARE = 0.15
# A step that launched this many kernels (its last profile says so), or whose last profile was cut, is profiled
# for one active step instead of three: the profiler's cost grows with the events it records and exports.
MANY_KERNELS_PER_STEP = 2000
SHORT_PROFILE_STEPS = 3  # wait 1, warm-up 1, active 1 (perflab/tune/trial.py profile_capture)
BATCH_NOTE = ("batch size changes the optimisation (the learning rate and schedule were tuned for the old batch): "
              "re-check convergence before adopting it")
FINDING_KEYS = ("cls", "confidence", "expected_gain_pct", "levers")  # what tune.json's diagnoses keep of a finding
NO_LEVER_WON = "every proposed lever was tried, refused or lost"
NO_SETTING_WON = "every proposed lever and every setting the queue diagnosis proposed was tried, refused or lost"

Diagnoser = Callable[[Path, Optional[Result], list[str]], Any]


class TuneObserver:
    """Progress callbacks; the CLI draws a live table from them, the library ignores them."""

    def trial_started(self, name: str, kind: str) -> None:
        pass

    def trial_finished(self, row: TrialRow, reused: bool) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class SearchStopped(Exception):
    """Raised inside the loop when the budget or --max-trials says stop; carries the reason."""

    def __init__(self, reason: StopReason):
        super().__init__(reason.text())
        self.reason = reason


def profile_steps(steps: int, kernels_per_step: Optional[float], last_profile_cut: bool) -> int:
    """The timed steps of a profile trial (perflab/tune/trial.py fits the profiler's schedule in them): one active
    step where the step launches thousands of kernels or the last profile was cut, three otherwise."""
    if last_profile_cut or (kernels_per_step or 0.0) >= MANY_KERNELS_PER_STEP:
        return min(steps, SHORT_PROFILE_STEPS)
    return min(steps, PROFILE_STEPS)


def diagnose_trace(trace: Path, result: Optional[Result], tried_and_lost: list[str]) -> Any:
    """perflab.diagnose on a profile's trace, told which levers lost when this diagnose accepts that."""
    if "tried_and_lost" in inspect.signature(diagnose).parameters:
        return diagnose(trace, result, tried_and_lost=list(tried_and_lost))
    return diagnose(trace, result)


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
        self.start = start.replace(out=None).validate()
        settings.check_start(self.start)
        self.measure = SERVE if settings.objective == MAX_QPS else "run"  # the kind of a measured trial
        self.out = Path(out)
        self.diagnoser = diagnoser
        self.observer = observer or TuneObserver()
        self.cpu_count = cpu_count or usable_cpus()
        self.levers = {lever.name: lever for lever in all_levers()}
        self.workloads = WorkloadBuilds(self.start, workload, check_workload and workload is None)
        (self.out / TRIALS_DIR).mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.out, settings.resume)
        self.journal.check_same_start(self.start, self.measure)
        self.budget = Budget(settings.budget_s)
        self.recorder = TrialRecorder(self.out, self.journal, self.budget, runner, self.observer, self._judge)
        # Two stages (perflab/tune/screening.py) for the throughput objective; max-qps, or screening=False, tries
        # each candidate in full at once.
        self.screener = Screener(self) if screening and self.measure == "run" else None
        self.unconfirmed: list[UnconfirmedWin] = []  # screened wins the budget left no room to confirm
        self.lost: list[str] = []  # levers tried that never won (the diagnosis is told, and never re-proposes)
        self.settled: set[str] = set()  # levers whose search is over, won or lost
        self.retries = NoiseRetries()  # inside the noise against a large prediction: once more after a keep
        self.chain: list[TrialRow] = []  # every judged trial, in order
        self.diagnoses: list[DiagnosisEntry] = []
        self.skipped: dict[str, str] = {}
        self.notes: list[str] = []
        self.last_profile_s: Optional[float] = None  # wall time of the last profile trial
        self.profile_cut: Optional[str] = None  # what became of a profile cut at its limit (the stop line says it)
        self.compile_cost = CompileCost()
        self.best_cfg = self.start
        # --objective max-qps: the serve settings of the best trial (the batching policy tune may change, once no
        # model lever is left, as the best trial's own inference-queue diagnosis proposes)
        self.serve_cfg = settings.serve
        self.tried_settings: set[str] = set()
        self.best: Optional[Result] = None
        self.best_row: Optional[TrialRow] = None
        self.baseline_row: Optional[TrialRow] = None
        self.diagnosis: Any = None
        self.stopped: Optional[StopReason] = None

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
        kept = [row.label for row in self.chain if row.kept]
        context = StopContext(
            best_label=self.best_row.label if self.best_row is not None else None, kept=kept,
            advice=list(getattr(self.diagnosis, "advice", None) or []),
            unconfirmed=[win.describe() for win in self.unconfirmed], noise=self._noise(),
            profile_cut=self.profile_cut, unjudged=unjudged_line([row.decision for row in self.chain]))
        return stop_line(reason, context)

    def _noise(self) -> Optional[str]:
        """Why 'no lever won' is no verdict: the start's own throughput moves more than the gain a screen must show
        (None when it holds still, or nothing says)."""
        if self.screener is None or self.baseline_row is None:
            return None
        noise = start_noise_pct(self.baseline_row, self.screener.references)
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
                self.check_budget()
                self._check_room_for_a_round()
                self.diagnosis = self._profile_and_diagnose()
                if self._near_peak():
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
                    return StopReason(StopKind.NO_LEVER_WON, NO_LEVER_WON)
        except SearchStopped as stop:
            return stop.reason

    def _measure_start(self) -> None:
        """The starting point's full trial: the first best, and the baseline every gain is read against."""
        record = self.record(TrialRequest(self.start, self.measure, "start", time_limit_s=self.budget.left_s()))
        row, result = record.row, record.result
        if result is None:
            raise self._start_failed(row)
        if self.measure == SERVE and max_qps_of(result) is None:
            raise PerflabError(f"the starting point meets no rate with p99 under --p99-ms "
                               f"{self.settings.serve.p99_ms:g} ({row.search_skipped or 'every rate tried failed'})"
                               f"; raise --p99-ms (see {self.out / row.dir})")
        if row.status == QUALITY_FAIL:
            self.notes.append(f"the starting point itself failed its quality gate ({row.reason}); every "
                              "candidate is still gated against the fp32 eager baseline")
        broken = constraint_violations(result, self.settings.max_p99_ms, self.settings.max_memory_gb)
        if broken:  # said once: every candidate is held to a bound the start itself does not meet
            self.notes.append(f"the starting point itself breaks the constraints ({'; '.join(broken)}): a lever is "
                              "kept only if its run meets them; loosen them to tune from here")
        self.start = result.config.run_config().replace(out=None)  # device and batch resolved
        self.workloads.start = self.start
        self.best_cfg = self.start
        self.best, self.best_row, self.baseline_row = result, row, row

    def _start_failed(self, row: TrialRow) -> PerflabError:
        """Why the starting point gave nothing to tune from: it did not finish in the budget, ran out of memory,
        or failed."""
        if row.status == TIMEOUT:
            return PerflabError(f"the starting point did not finish within --budget {self.settings.budget} "
                                f"({row.wall_s:.0f} s; the budget is a promise, and every trial is stopped when "
                                f"it runs out): give a larger --budget (see {self.out / row.dir}.log)")
        if row.status == OOM:
            return self._start_out_of_memory(row)
        return PerflabError(f"the starting point did not run ({row.status}: {row.reason}); see "
                            f"{self.out / row.dir}.log")

    def _start_out_of_memory(self, row: TrialRow) -> PerflabError:
        """The starting point did not fit: its own record (the short block, exit code 3) when its run saved one."""
        path = self.out / row.dir / "result.json"
        record = getattr(Result.load(path.parent), "out_of_memory", None) if path.is_file() else None
        if not record:
            return OutOfMemoryFailure(f"the starting point ran out of memory ({row.reason}); see "
                                      f"{self.out / row.dir}.log", {"message": row.reason, "device": "?"})
        return OutOfMemory.from_dict(record).failure()

    def _nothing_to_try(self) -> StopReason:
        """Why the search ends without a trial: the diagnosis's advice is what remains (e.g. remove a sync)."""
        return StopReason(StopKind.NO_LEVER_LEFT, self.diagnosis.bottleneck if self.diagnosis is not None else "")

    # ------------------------------------------------------------------------------------------ the budget

    def stop(self, reason: StopReason) -> None:
        """End the search now (the budget or --max-trials says so): the loop returns `reason`."""
        raise SearchStopped(reason)

    def budget_reason(self) -> Optional[StopReason]:
        """Why no further trial may start (the budget, or --max-trials, is spent), or None."""
        if self.budget.is_spent():
            return StopReason(StopKind.BUDGET_SPENT, self.budget.spent_line())
        if self.settings.max_trials is not None and self.count >= self.settings.max_trials:
            return StopReason(StopKind.MAX_TRIALS, str(self.settings.max_trials))
        return None

    def check_budget(self) -> None:
        reason = self.budget_reason()
        if reason is not None:
            raise SearchStopped(reason)

    def _check_room_for_a_round(self) -> None:
        """Stop before a re-profile when the budget left would not cover it and one trial after it (as long as
        the last ones took): a profile that no trial can follow only spends time."""
        if self.last_profile_s is None:
            return
        left = self.budget.total_s - self.budget.spent_s
        trial_s = self.best_row.wall_s
        if self.screener is not None and self.screener.reference is not None:
            trial_s = 2 * self.screener.reference.wall_s  # a round: a reference and one screen at least
        if left < self.last_profile_s + trial_s:
            self.stop(StopReason(StopKind.BUDGET_NEARLY_SPENT,
                                 f"{max(0.0, left):.0f} s left, less than a profile ({self.last_profile_s:.0f} s) "
                                 f"and one trial ({trial_s:.0f} s) take"))

    # ------------------------------------------------------------------------------------------ the search

    def round_proposals(self) -> list[search.Proposal]:
        """The levers this round proposes: the diagnosis's, or, when the profile was cut, the insurance levers."""
        if self.diagnosis is None and self._last_profile_cut():
            return insurance_proposals(self.levers)
        return search.proposals(self.diagnosis, self.levers)

    def _try_levers(self) -> bool:
        """Try the proposed levers in order until one is kept (True) or none is left (False)."""
        if self.screener is not None:
            if self.screener.round():
                return True
            if self.settings.tune_batch and search.BATCH_LEVER not in self.settled:
                return self._search_batch()
            return False
        arranged = ordering.arrange(self.round_proposals(), self.best_cfg)
        for proposal in arranged:
            if self._search_lever(proposal):
                partner = ordering.partner_of(proposal.lever)
                for other in arranged:  # its partner before re-profiling: the two are one win in two trials
                    if other.lever == partner:
                        self._search_lever(other)
                return True
        if self.settings.tune_batch and search.BATCH_LEVER not in self.settled:
            return self._search_batch()
        return False

    def _try_serve_settings(self) -> bool:
        """With --objective max-qps, once no model lever is left: each serve setting the best trial's own
        inference-queue diagnosis proposes (max batch, batch timeout, instances, bucket step), against the best;
        True when one was kept (the next round reads the new best's diagnosis)."""
        for change in setting_changes(serve_record(self.best)):
            flag = options.option_named(ServeConfig, change.option).flag.lstrip("-")
            label = f"{flag}={change.value:g}" if isinstance(change.value, float) else f"{flag}={change.value}"
            if label in self.tried_settings:
                continue
            self.tried_settings.add(label)
            serve_cfg = dataclasses.replace(self.serve_cfg, **{change.option: change.value})
            try:
                serve_cfg.validate()
            except PerflabError as err:
                self.skipped[label] = str(err)
                continue
            self.check_budget()
            context = {"lever": flag, "label": label, "option": change.option, "value": change.value,
                       "search": SERVE_SETTING, "against": self.best_row.name, "bottleneck": INFERENCE_QUEUE,
                       "proposed_by": INFERENCE_QUEUE, "why_proposed": change.why}
            record = self.record(TrialRequest(self.trial_config(self.best_cfg), SERVE, label, context,
                                              judge_against=self.best, time_limit_s=self.budget.left_s(),
                                              serve_cfg=serve_cfg))
            self.chain.append(record.row)
            if record.kept:
                self.serve_cfg = serve_cfg
                self.best, self.best_row = record.result, record.row
                return True
        return False

    def _search_lever(self, proposal: search.Proposal) -> bool:
        """Search one proposed lever's values against the best so far; True when one was kept."""
        if proposal.lever in self.settled or proposal.lever in self.settings.exclude:
            return False
        candidates = search.expand(proposal, self.levers[proposal.lever], self.best_cfg, self.cpu_count)
        return bool(candidates) and self._search(candidates)

    def _search(self, candidates: list[search.Candidate]) -> bool:
        """Try a lever's values: a ladder climbs until LADDER_PATIENCE rungs in a row do not win; alternatives
        are each tried; a one-value lever once."""
        kept_any = tried = measured = False
        misses = 0  # ladder rungs in a row that did not win
        lever = candidates[0].lever
        for candidate in candidates:
            if not self.can_try(candidate):
                continue
            self.check_budget()
            kept, tried = self.try_candidate(candidate), True
            kept_any = kept_any or kept
            measured = measured or self.chain[-1].judged and self.chain[-1].measured
            misses = 0 if kept else misses + 1
            if candidate.search == search.ONCE or candidate.search == search.LADDER and \
                    misses >= search.LADDER_PATIENCE:
                break
        if tried:
            self.settled.add(lever)
        if measured and not kept_any:  # refused, crashed or noisy trials are not losses: nothing was judged
            note = self.retries.defer(lever, candidates[-1].search == search.ONCE, self.chain[-1])
            if note is None:
                self.lost.append(lever)
            else:
                self.notes.append(note)
        return kept_any

    def _search_batch(self) -> bool:
        """Grow the batch until it runs out of memory or stops paying, then bisect towards the OOM."""
        if self.best_cfg.mode == "train" and BATCH_NOTE not in self.notes:
            self.notes.append(BATCH_NOTE)
        good, out_of_memory, kept_any = self.best_cfg.batch_size, None, False
        batch: Optional[int] = good * 2
        proposal = search.Proposal(search.BATCH_LEVER, "batch size (--tune-batch)", None, None)
        while batch is not None and batch <= BATCH_LIMIT:
            self.check_budget()
            candidate = search.Candidate(proposal, "batch_size", batch, search.BATCH)
            kept = self.try_candidate(candidate)
            if kept:
                good, kept_any = batch, True
                batch = good * 2 if out_of_memory is None else search.bisect_batch(good, out_of_memory)
            elif self.chain[-1].status == OOM:
                out_of_memory = batch
                batch = search.bisect_batch(good, out_of_memory)
            else:
                break
        self.settled.add(search.BATCH_LEVER)  # searched: not again, whatever it kept
        if out_of_memory is not None:  # memory stopped the batch: checkpointing may buy a larger one
            kept_any = self._trade_memory_for_batch(good, out_of_memory) or kept_any
        return kept_any

    def _trade_memory_for_batch(self, good: int, out_of_memory: int) -> bool:
        """Activation checkpointing with the larger batch it allows (perflab/tune/memory_trade.py), tried as one
        candidate against the best; kept only when it wins. Its outcome, kept or why not, is a note."""
        lever = CHECKPOINTING
        if self.best_cfg.mode != "train" or self.best_cfg.activation_checkpointing or lever in self.settings.exclude \
                or lever in self.settled and lever not in self.lost:
            return False
        declared = self.levers[lever]  # its option and value, as the lever declares them
        proposal = search.Proposal(lever, "batch size (--tune-batch) ran out of memory", None, None)
        probe = search.Candidate(proposal, declared.option, declared.value, search.BATCH)
        if not self.can_try(probe):  # the lever is refused here (no checkpointable blocks, inference)
            return False
        batch, basis = checkpointed_batch(self.best_cfg, good, out_of_memory)
        batch = min(batch, BATCH_LIMIT)
        label = f"{lever}+batch-size={batch}"
        if batch <= good:
            self.skipped[label] = f"checkpointing allows no batch above {good} ({basis})"
            self.observer.note(f"not trying {label}: {self.skipped[label]}")
            return False
        self.check_budget()
        pair = search.Candidate(proposal, declared.option, declared.value, search.BATCH, also=(("batch_size", batch),))
        trade = MemoryTrade(good, out_of_memory, batch, basis)
        kept = self.try_candidate(pair, {"trade": trade.to_dict()})
        row = self.chain[-1]
        row.trade = trade  # its verdict, once judged, is tune.json's (tune.jsonl has the trade as it was tried)
        trade.verdict = trade_verdict(row, trade)
        self.notes.append(f"{trade.verdict}; {basis}")
        self.settled.add(lever)
        return kept

    def can_try(self, candidate: search.Candidate, estimate_cost: bool = True) -> bool:
        """Whether the candidate can run here (and, with `estimate_cost`, a compile mode's full trial fits the budget
        left; the screener estimates its own trials); records why not under `skipped`."""
        cfg = self.candidate_config(candidate)
        reason = search.refusal_before_trying(candidate, cfg, self.levers.get(candidate.lever), self.workloads.for_config)
        if reason is None and self.measure == SERVE:
            reason = serve_refusal(candidate.option)
        if reason is None and candidate.search == search.ONCE:
            reason = ordering.replaces_kept(candidate.option, candidate.value, self.best_cfg, self.start)
        if reason is None and search.compiles(self.levers.get(candidate.lever)) and estimate_cost:
            reason = self._compile_over_budget(candidate.value)
        if reason is None:
            reason = search.covered_by_kept(candidate, self.levers.get(candidate.lever), self.best_cfg)
        if reason is not None:
            self._refuse(candidate.label, candidate.lever, reason)
            return False
        return True

    def _refuse(self, label: str, lever: str, reason: str) -> None:
        """Record why `label` is not tried (tune.json's skipped); say it unless another value of the same lever was
        refused for the same reason (workers=2, 4, 8, 16, 32 on batches staged on the device: one line, not five)."""
        if label in self.skipped:
            return
        said = any(why == reason for other, why in self.skipped.items()
                   if other == lever or other.startswith(lever + "="))
        self.skipped[label] = reason
        if not said:
            self.observer.note(f"not trying {label}: {reason}")

    def _compile_over_budget(self, mode: str) -> Optional[str]:
        """Why a compile mode does not fit in the budget left (its trial's expected wall time is more), or None."""
        return self.compile_cost.over_budget(mode, self.best_row.wall_s, self.budget.left_s())

    # ------------------------------------------------------------------------------------------ one trial

    def candidate_config(self, candidate: search.Candidate) -> RunConfig:
        """The best with the candidate applied (with the warm-up its value needs: a compile mode's compilation)."""
        return candidate.apply(self.best_cfg)

    def trial_config(self, cfg: RunConfig) -> RunConfig:
        """A candidate runs with the quality gate on; --quality strict halves the tolerance of its precision."""
        cfg = cfg.replace(check_quality=True, quality_rtol=self.start.quality_rtol,
                          quality_loss_rtol=self.start.quality_loss_rtol)
        if self.settings.quality == "strict":
            cfg = cfg.replace(**strict_tolerances(cfg))
        return cfg

    def context(self, candidate: search.Candidate) -> dict[str, Any]:
        """What tune.jsonl records of a candidate beside its figures: the lever, who proposed it, the prediction."""
        return {"lever": candidate.lever, "label": candidate.label, "option": candidate.option,
                "value": candidate.value, "search": candidate.search, "against": self.best_row.name,
                "bottleneck": self._verdict(), "proposed_by": candidate.proposal.source,
                "finding_confidence": candidate.proposal.confidence,
                "predicted_step_share_pct": candidate.proposal.expected_share_pct,
                "predicted_gain_pct": predicted_gain_pct(candidate.proposal.expected_share_pct)}

    def try_candidate(self, candidate: search.Candidate, extra: Optional[dict[str, Any]] = None,
                      trials: Optional[tuple[int, float]] = None) -> bool:
        """A full trial of best + candidate, judged against the best and kept when it wins; `trials`: (--trials,
        --min-trial-s) of a confirmation sized to the budget left."""
        cfg = self.trial_config(self.candidate_config(candidate))
        if trials is not None:
            cfg = cfg.replace(trials=trials[0], min_trial_s=trials[1])
        against_s = self.best_row.wall_s
        # Every trial is stopped (status timeout) when it would pass the budget: the budget is a promise.
        record = self.record(TrialRequest(cfg, self.measure, candidate.label, {**self.context(candidate), **(extra or {})},
                                          judge_against=self.best, time_limit_s=self.budget.left_s()))
        self.chain.append(record.row)
        if search.measures_compile_cost(candidate, self.levers.get(candidate.lever)) and record.row.measured:
            self.compile_cost.measured(against_s, record.row.wall_s)  # what the other modes will cost
        if record.kept:
            self.best_cfg = cfg
            self.best, self.best_row = record.result, record.row
            self.settled.difference_update(self.retries.release())
        return record.kept

    def record(self, request: TrialRequest) -> TrialRecord:
        """Run (or reuse from tune.jsonl) one trial and record it; a serve trial runs under the best serve
        settings unless the request names others."""
        if request.kind == SERVE and request.serve_cfg is None:
            request = dataclasses.replace(request, serve_cfg=self.serve_cfg)
        return self.recorder.record(request)

    def _judge(self, best: Result, outcome: TrialOutcome) -> Decision:
        s = self.settings
        if self.measure == SERVE:
            return judge_max_qps(best, outcome.result, s.min_effect_pct)
        return judge(best, outcome.result, s.min_effect_pct, s.max_p99_ms, s.max_memory_gb, s.accept_noisy)

    # ------------------------------------------------------------------------------------------ diagnosis

    def _profile_and_diagnose(self) -> Any:
        """Profile the current best in its own process, within PROFILE_SHARE of the budget, and diagnose its trace
        (levers that lost excluded); None when the profile gave no trace."""
        # The diagnosis reads the profiled steps only (the loader's queue is drained before them): a trial of
        # just the profiler's schedule is enough, not --steps or --min-trial-s of timed steps.
        steps = profile_steps(self.best_cfg.steps, self._kernels_per_step(), self._last_profile_cut())
        cfg = self.best_cfg.replace(trials=1, check_quality=False, steps=steps, min_trial_s=0.0)
        limit_s = min(self.budget.left_s(), self.budget.share_s(PROFILE_SHARE))
        record = self.record(TrialRequest(cfg, "profile", f"profile-{self.best_row.label}", time_limit_s=limit_s))
        row = record.row
        self.last_profile_s = row.wall_s
        entry = DiagnosisEntry(row.name, self.best_row.name, row.status, steps)
        diagnosis = None
        trace = self.out / row.dir / "trace.json"
        if row.status == OK and trace.is_file():
            diagnosis = self.diagnoser(trace, record.result, list(self.lost))
            entry.bottleneck, entry.confidence = diagnosis.bottleneck, diagnosis.confidence
            entry.headline, entry.levers = diagnosis.headline, list(diagnosis.levers)
            entry.findings = [{key: getattr(f, key, None) for key in FINDING_KEYS} for f in diagnosis.findings]
        elif row.status == TIMEOUT:
            entry.cut, entry.headline = True, self._profile_was_cut(limit_s)
        else:
            entry.headline = f"no diagnosis ({row.status}: {row.reason}); trying every applicable lever"
        self.diagnoses.append(entry)
        self.observer.note(f"diagnosis of {self.best_row.name}: {entry.bottleneck or 'none'} — {entry.headline}")
        return diagnosis

    def _profile_was_cut(self, limit_s: float) -> str:
        """A profile stopped at its limit: no diagnosis; the round screens the insurance levers. Said in the notes
        and the stop line."""
        names = ", ".join(proposal.lever for proposal in insurance_proposals(self.levers))
        line = (f"the profile of {self.best_row.label} was cut at its limit ({limit_s:.0f} s, "
                f"{PROFILE_SHARE:.0%} of the budget): no diagnosis, so the levers every workload is screened with "
                f"were screened instead ({names})")
        self.profile_cut = line
        if line not in self.notes:
            self.notes.append(line)
        return line

    def _gpu_figure(self, name: str) -> Optional[float]:
        """A figure of the GPU's share of the last diagnosis's trace profile (None before one, or without a GPU)."""
        gpu = getattr(getattr(self.diagnosis, "profile", None), "gpu", None)
        return getattr(gpu, name, None)

    def _kernels_per_step(self) -> Optional[float]:
        """Kernels a step launched, as the last diagnosis counted them (None before one)."""
        return self._gpu_figure("kernels_per_step")

    def _last_profile_cut(self) -> bool:
        return bool(self.diagnoses and self.diagnoses[-1].cut)

    def _verdict(self) -> Optional[str]:
        return None if self.diagnosis is None else self.diagnosis.bottleneck

    def _near_peak(self) -> bool:
        if self.diagnosis is None or self.best is None:
            return False
        busy = self._gpu_figure("busy_pct")
        mfu = self.best.metrics.flops.mfu_pct if self.best.metrics.flops else None
        return busy is not None and mfu is not None and busy >= NEAR_PEAK_BUSY_PCT and mfu >= NEAR_PEAK_MFU_PCT

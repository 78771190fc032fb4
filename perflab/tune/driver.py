"""The tune loop: measure and diagnose the best so far, try the ranked levers, keep what is proven, repeat.

    measure start -> profile + diagnose -> for each proposed lever (a value search for numeric knobs):
        trial = best + lever, measured in its own process with the quality gate on
        compare(best, trial) accepts and the constraints hold -> keep it (best = trial), re-profile
        otherwise -> the lever lost; it is not tried again
    until no lever wins, the budget or --max-trials is spent, or the GPU is busy with MFU near the peak.

With --objective max-qps a measured trial (the start, each candidate) is `perflab serve --find-max-qps` and is
judged by its max QPS (perflab/tune/objective.py); the profiles behind the diagnosis stay `perflab profile` of
the inference step at the max batch, so the levers are still ranked from where the step's time goes. Once no
model lever is left, the serve settings that the best trial's own inference-queue diagnosis proposes (max batch,
batch timeout, instances, bucket step: perflab.diagnose.inference_queue.setting_changes) are tried the same way.

Every trial is one row of tune.jsonl written before the next begins; on --resume the loop replays and
reuses the recorded rows (its choices depend only on them), so nothing is lost and nothing is run twice.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
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
from perflab.tune.candidates import usable_cpus
from perflab.tune.decision import Decision, judge, not_measured, unjudged_line
from perflab.serve.config import ServeConfig
from perflab.tune.objective import SERVE, judge_max_qps, max_qps_of, serve_record, serve_refusal
from perflab.tune.journal import Journal, trial_key
from perflab.tune.memory_trade import checkpointed_batch, trade_verdict
from perflab.tune.retry import NoiseRetries
from perflab.tune.screening import SCREEN, Screener, gain_pct, start_noise_pct, win_threshold_pct
from perflab.tune.settings import MAX_QPS, TuneConfig, strict_tolerances
from perflab.tune.trial import (OK, OOM, PROFILE_STEPS, QUALITY_FAIL, TIMEOUT, TrialOutcome, run_trial,
                                trial_figures)
from perflab.diagnose import diagnose
from perflab.diagnose.inference_queue import setting_changes
from perflab.workloads import load_workload

SERVE_SETTING = "serve-setting"  # the search kind of a serve-settings candidate (max-qps objective)

TRIALS_DIR = "trials"
NEAR_PEAK_BUSY_PCT = 95.0
NEAR_PEAK_MFU_PCT = 70.0  # share of the calibrated peak that counts as "near it"
BATCH_LIMIT = 4096
# Seconds of the budget kept for writing tune.json and the report once the last trial is stopped (the budget is
# a promise: tune ends within 5% of it); at most FINISH_RESERVE_SHARE of the budget.
FINISH_RESERVE_S = 4.0
FINISH_RESERVE_SHARE = 0.02
MIN_TRIAL_LEFT_S = 1.0  # less budget left than this: no trial can start and finish in it
BATCH_NOTE = ("batch size changes the optimisation (the learning rate and schedule were tuned for the old batch): "
              "re-check convergence before adopting it")

Runner = Callable[..., TrialOutcome]  # (cfg, kind, out[, time_limit_s=]) -> outcome
Diagnoser = Callable[[Path, Optional[Result], list[str]], Any]


class TuneObserver:
    """Progress callbacks; the CLI draws a live table from them, the library ignores them."""

    def trial_started(self, name: str, kind: str) -> None:
        pass

    def trial_finished(self, row: dict[str, Any], reused: bool) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class BudgetSpent(Exception):
    """Raised inside the loop when the budget or --max-trials says stop; carries the reason."""


def predicted_gain_pct(share_pct: Optional[float]) -> Optional[float]:
    """Throughput gain if a share of the step vanished entirely: 1 / (1 - share) - 1."""
    if share_pct is None:
        return None
    share = min(max(share_pct, 0.0), 99.0) / 100
    return 100 * (1 / (1 - share) - 1)


def diagnose_trace(trace: Path, result: Optional[Result], tried_and_lost: list[str]) -> Any:
    """perflab.diagnose on a profile's trace, told which levers lost when this diagnose accepts that."""
    if "tried_and_lost" in inspect.signature(diagnose).parameters:
        return diagnose(trace, result, tried_and_lost=list(tried_and_lost))
    return diagnose(trace, result)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text)


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
        self.runner = runner
        self.diagnoser = diagnoser
        self.observer = observer or TuneObserver()
        self.cpu_count = cpu_count or usable_cpus()
        self.levers = {lever.name: lever for lever in all_levers()}
        self.workload = workload  # built on first use, for the levers' refusals
        self.check_workload = check_workload and workload is None
        self.built_for: dict[str, Any] = {}  # workloads built for candidates' settings, to confirm a refusal
        (self.out / TRIALS_DIR).mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.out, settings.resume)
        self.journal.check_same_start(self.start, self.measure)
        # The budget is charged the tune's real time: every recorded trial's wall time (reused ones on --resume
        # included) plus what this process spent outside its trials (diagnoses, workload builds, bookkeeping).
        self.began: Optional[float] = None
        self.recorded_s = 0.0  # the wall time of every trial row used, fresh or reused
        self.fresh_trial_s = 0.0  # of that, the trials this process ran (measured here, around the runner)
        self.charged: set[str] = set()  # the keys of the rows charged to the budget
        # Two stages (perflab/tune/screening.py) for the throughput objective; max-qps, or screening=False, tries
        # each candidate in full at once.
        self.screener = Screener(self) if screening and self.measure == "run" else None
        self.unconfirmed: list[str] = []  # screened wins the budget left no room to confirm
        self.on_record: Optional[Callable[[], None]] = None  # called after every recorded trial (tune.json)
        self.count = 0
        self.lost: list[str] = []  # levers tried that never won (the diagnosis is told, and never re-proposes)
        self.settled: set[str] = set()  # levers whose search is over, won or lost
        self.retries = NoiseRetries()  # inside the noise against a large prediction: once more after a keep
        self.chain: list[dict[str, Any]] = []
        self.diagnoses: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}
        self.notes: list[str] = []
        self.last_profile_s: Optional[float] = None  # wall time of the last profile trial
        self.plain_trial_s: Optional[float] = None  # wall time of the trial compile=default was judged against
        self.compile_extra_s: Optional[float] = None  # what compile=default's trial took beyond that one
        self.best_cfg = self.start
        # --objective max-qps: the serve settings of the best trial (the batching policy tune may change, once no
        # model lever is left, as the best trial's own inference-queue diagnosis proposes)
        self.serve_cfg = settings.serve
        self.tried_settings: set[str] = set()
        self.best: Optional[Result] = None
        self.best_row: Optional[dict[str, Any]] = None
        self.baseline_row: Optional[dict[str, Any]] = None
        self.diagnosis: Any = None

    # ------------------------------------------------------------------------------------------ the loop

    @property
    def spent_s(self) -> float:
        """The budget spent so far: recorded trials plus this process's own time outside them."""
        if self.began is None:
            return self.recorded_s
        outside = max(0.0, time.perf_counter() - self.began - self.fresh_trial_s)
        return self.recorded_s + outside

    def time_left_s(self) -> float:
        """What a trial may take from now: the budget left, less the reserve for writing the results."""
        budget = self.settings.budget_s
        return budget - self.spent_s - min(FINISH_RESERVE_S, FINISH_RESERVE_SHARE * budget)

    def run(self) -> str:
        """Tune until a stop condition; returns why it stopped (and what was kept, screened or left)."""
        self.began = time.perf_counter()
        return self._honest(self._run())

    def _honest(self, reason: str) -> str:
        """The stop line agrees with the best: it names what was kept, and any screened win left unconfirmed."""
        kept = [row["label"] for row in self.chain if (row.get("decision") or {}).get("kept")]
        if kept and reason.startswith("no lever won"):
            reason = "no further lever won" + reason[len("no lever won"):]
        if kept and reason.startswith("no lever or serve setting won"):
            reason = "no further lever or serve setting won" + reason[len("no lever or serve setting won"):]
        if not kept and reason.startswith("no lever won"):
            reason = self._inside_the_noise(reason)
        advice = list(getattr(self.diagnosis, "advice", None) or [])
        if not kept and advice and "advises" not in reason:  # what is left to do is the user's, not a lever's
            reason += f"; the diagnosis advises: {advice[0]}"
        if self.best_row is not None:
            reason += f"; best: {self.best_row['label']} (kept: {', '.join(kept) if kept else 'nothing'})"
        if self.unconfirmed:
            reason += "; " + "; ".join(self.unconfirmed)
        unjudged = unjudged_line([row.get("decision") for row in self.chain])
        if unjudged:  # "no lever won" is not a verdict on levers whose trials were never judged
            reason += f"; {unjudged}"
        return reason

    def _inside_the_noise(self, reason: str) -> str:
        """'no lever won' is a verdict only when the start's own throughput holds still within the gain a screen
        must show; otherwise the search was inconclusive, and says by how much the start moved."""
        if self.screener is None or self.baseline_row is None:
            return reason
        noise = start_noise_pct(self.baseline_row, self.screener.references)
        threshold = win_threshold_pct(self.settings.min_effect_pct)
        if noise is None or noise <= threshold:
            return reason
        return (f"inconclusive: {reason}, but the starting point's own throughput moves {noise:.0f}% from one "
                f"measurement to the next, more than the +{threshold:g}% a screen must show, so a lever's gain of "
                "that size cannot be told from the noise; steady the step first (what varies: `perflab profile`) or "
                "give each trial longer (--min-trial-s)")

    def _run(self) -> str:
        row, result = self._trial(self.start, self.measure, "start", time_limit_s=self.time_left_s())
        if result is None and row["status"] == TIMEOUT:
            raise PerflabError(f"the starting point did not finish within --budget {self.settings.budget} "
                               f"({row['wall_s']:.0f} s; the budget is a promise, and every trial is stopped when "
                               f"it runs out): give a larger --budget (see {self.out / row['dir']}.log)")
        if result is None and row["status"] == OOM:
            raise self._start_out_of_memory(row)
        if result is None:
            raise PerflabError(f"the starting point did not run ({row['status']}: {row['reason']}); see "
                               f"{self.out / row['dir']}.log")
        if self.measure == SERVE and max_qps_of(result) is None:
            raise PerflabError(f"the starting point meets no rate with p99 under --p99-ms "
                               f"{self.settings.serve.p99_ms:g} ({row.get('search_skipped') or 'every rate tried failed'})"
                               f"; raise --p99-ms (see {self.out / row['dir']})")
        if row["status"] == QUALITY_FAIL:
            self.notes.append(f"the starting point itself failed its quality gate ({row['reason']}); every "
                              "candidate is still gated against the fp32 eager baseline")
        self.start = RunConfig.from_dict({**result.config, "out": None})  # device and batch resolved
        self.best_cfg = self.start
        self.best, self.best_row, self.baseline_row = result, row, row
        try:
            while True:
                self._check_budget()
                self._check_room_for_a_round()
                self.diagnosis = self._profile_and_diagnose()
                if self._near_peak():
                    return "near the peak: the GPU is busy and MFU is near the calibrated peak; nothing left to win"
                trials_before = self.count
                if not self._try_levers():
                    if self.measure == SERVE and self._try_serve_settings():
                        continue
                    if self.count == trials_before:
                        return self._nothing_to_try()
                    if self.measure == SERVE:
                        return ("no lever or serve setting won: every proposed lever and every setting the queue "
                                "diagnosis proposed was tried, refused or lost")
                    return "no lever won: every proposed lever was tried, refused or lost"
        except BudgetSpent as stop:
            return str(stop)

    def _start_out_of_memory(self, row: dict[str, Any]) -> PerflabError:
        """The starting point did not fit: its own record (the short block, exit code 3) when its run saved one."""
        path = self.out / row["dir"] / "result.json"
        record = getattr(Result.load(path.parent), "out_of_memory", None) if path.is_file() else None
        if not record:
            return OutOfMemoryFailure(f"the starting point ran out of memory ({row['reason']}); see "
                                      f"{self.out / row['dir']}.log", {"message": row["reason"], "device": "?"})
        return OutOfMemory.from_dict(record).failure()

    def _nothing_to_try(self) -> str:
        """Why the search ends without a trial: the diagnosis's advice is what remains (e.g. remove a sync)."""
        if self.diagnosis is None:
            return "no lever left to try"
        advice = list(getattr(self.diagnosis, "advice", None) or [])
        return (f"no lever left to try for {self.diagnosis.bottleneck}"
                + (f"; the diagnosis advises: {advice[0]}" if advice else ""))

    def stop(self, reason: str) -> None:
        """End the search now (the budget or --max-trials says so): the loop returns `reason`."""
        raise BudgetSpent(reason)

    def budget_reason(self) -> Optional[str]:
        """Why no further trial may start (the budget, or --max-trials, is spent), or None."""
        budget = self.settings.budget_s
        if self.spent_s >= budget or self.time_left_s() < MIN_TRIAL_LEFT_S:
            return f"budget spent: {self.spent_s:.0f} s of {budget:.0f} s"
        if self.settings.max_trials is not None and self.count >= self.settings.max_trials:
            return f"--max-trials {self.settings.max_trials} reached"
        return None

    def _check_budget(self) -> None:
        reason = self.budget_reason()
        if reason is not None:
            raise BudgetSpent(reason)

    def _check_room_for_a_round(self) -> None:
        """Stop before a re-profile when the budget left would not cover it and one trial after it (as long as
        the last ones took): a profile that no trial can follow only spends time."""
        if self.last_profile_s is None:
            return
        left = self.settings.budget_s - self.spent_s
        trial_s = self.best_row["wall_s"]
        if self.screener is not None and self.screener.reference is not None:
            trial_s = 2 * self.screener.reference["wall_s"]  # a round: a reference and one screen at least
        if left < self.last_profile_s + trial_s:
            raise BudgetSpent(f"budget nearly spent: {max(0.0, left):.0f} s left, less than a profile "
                              f"({self.last_profile_s:.0f} s) and one trial ({trial_s:.0f} s) take")

    def _try_levers(self) -> bool:
        """Try the proposed levers in order until one is kept (True) or none is left (False)."""
        if self.screener is not None:
            if self.screener.round():
                return True
            if self.settings.tune_batch and search.BATCH_LEVER not in self.settled:
                return self._search_batch()
            return False
        arranged = ordering.arrange(search.proposals(self.diagnosis, self.levers), self.best_cfg)
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
            self._check_budget()
            context = {"lever": flag, "label": label, "option": change.option, "value": change.value,
                       "search": SERVE_SETTING, "against": self.best_row["name"], "bottleneck": INFERENCE_QUEUE,
                       "proposed_by": INFERENCE_QUEUE, "why_proposed": change.why}
            row, result = self._trial(self._trial_config(self.best_cfg), SERVE, label, context,
                                      judge_against=self.best, serve_cfg=serve_cfg, time_limit_s=self.time_left_s())
            self.chain.append(row)
            if row["decision"]["kept"]:
                self.serve_cfg = serve_cfg
                self.best, self.best_row = result, row
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
            if not self._can_try(candidate):
                continue
            self._check_budget()
            kept, tried = self._try(candidate), True
            kept_any = kept_any or kept
            measured = measured or self.chain[-1]["decision"].get("judged", True) and \
                self.chain[-1]["status"] in (OK, QUALITY_FAIL)
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
            self._check_budget()
            candidate = search.Candidate(proposal, "batch_size", batch, search.BATCH)
            kept = self._try(candidate)
            if kept:
                good, kept_any = batch, True
                batch = good * 2 if out_of_memory is None else search.bisect_batch(good, out_of_memory)
            elif self.chain[-1]["status"] == OOM:
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
        lever = "activation-checkpointing"
        if self.best_cfg.mode != "train" or self.best_cfg.activation_checkpointing or lever in self.settings.exclude \
                or lever in self.settled and lever not in self.lost:
            return False
        proposal = search.Proposal(lever, "batch size (--tune-batch) ran out of memory", None, None)
        probe = search.Candidate(proposal, "activation_checkpointing", True, search.BATCH)
        if not self._can_try(probe):  # the lever is refused here (no checkpointable blocks, inference)
            return False
        batch, basis = checkpointed_batch(self.best_cfg, good, out_of_memory)
        batch = min(batch, BATCH_LIMIT)
        label = f"{lever}+batch-size={batch}"
        if batch <= good:
            self.skipped[label] = f"checkpointing allows no batch above {good} ({basis})"
            self.observer.note(f"not trying {label}: {self.skipped[label]}")
            return False
        self._check_budget()
        pair = search.Candidate(proposal, "activation_checkpointing", True, search.BATCH, also=(("batch_size", batch),))
        kept = self._try(pair, {"trade": {"batch_ran": good, "batch_out_of_memory": out_of_memory,
                                          "batch_tried": batch, "basis": basis}})
        row = self.chain[-1]
        row["trade"]["verdict"] = trade_verdict(row, good)
        self.notes.append(row["trade"]["verdict"] + f"; {basis}")
        self.settled.add(lever)
        return kept

    def _can_try(self, candidate: search.Candidate, estimate_cost: bool = True) -> bool:
        """Whether the candidate can run here (and, with `estimate_cost`, a compile mode's full trial fits the budget
        left; the screener estimates its own trials); records why not under `skipped`."""
        cfg = self._candidate_config(candidate)
        reason = search.refusal_before_trying(candidate, cfg, self.levers.get(candidate.lever), self._workload)
        if reason is None and self.measure == SERVE:
            reason = serve_refusal(candidate.option)
        if reason is None and candidate.search == search.ONCE:
            reason = ordering.replaces_kept(candidate.option, candidate.value, self.best_cfg, self.start)
        if reason is None and candidate.option == "compile" and estimate_cost:
            reason = self._compile_over_budget(candidate.value)
        if reason is None and candidate.value == "reduce-overhead" and self.best_cfg.compile == "max-autotune":
            reason = "compile=max-autotune (kept) already captures CUDA graphs"
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
        plain_s = self.plain_trial_s if self.plain_trial_s is not None else self.best_row["wall_s"]
        return search.compile_over_budget(mode, plain_s, self.compile_extra_s, self.time_left_s())

    def _workload(self, cfg: Optional[RunConfig] = None) -> Any:
        """The workload built for the starting point (once), or for `cfg` when given (cached by its settings);
        the one given to tune, or None, when tune builds none. Built on the CPU: no CUDA context here."""
        if not self.check_workload:
            return self.workload
        if cfg is None:
            if self.workload is None:
                self.workload = load_workload(self.start.workload, self.start)
            return self.workload
        key = repr(cfg.replace(out=None))
        if key not in self.built_for:
            self.built_for[key] = load_workload(cfg.workload, cfg)
        return self.built_for[key]

    # ------------------------------------------------------------------------------------------ one trial

    def _candidate_config(self, candidate: search.Candidate) -> RunConfig:
        cfg = candidate.apply(self.best_cfg)
        if candidate.option == "compile" and cfg.warmup < search.COMPILE_WARMUP[candidate.value]:
            # compilation (and, with CUDA graphs, their recording) must stay out of the timed steps
            cfg = cfg.replace(warmup=search.COMPILE_WARMUP[candidate.value])
        return cfg

    def _trial_config(self, cfg: RunConfig) -> RunConfig:
        """A candidate runs with the quality gate on; --quality strict halves the tolerance of its precision."""
        cfg = cfg.replace(check_quality=True, quality_rtol=self.start.quality_rtol,
                          quality_loss_rtol=self.start.quality_loss_rtol)
        if self.settings.quality == "strict":
            cfg = cfg.replace(**strict_tolerances(cfg))
        return cfg

    def _context(self, candidate: search.Candidate) -> dict[str, Any]:
        """What tune.jsonl records of a candidate beside its figures: the lever, who proposed it, the prediction."""
        return {"lever": candidate.lever, "label": candidate.label, "option": candidate.option,
                "value": candidate.value, "search": candidate.search, "against": self.best_row["name"],
                "bottleneck": self._verdict(), "proposed_by": candidate.proposal.source,
                "finding_confidence": candidate.proposal.confidence,
                "predicted_step_share_pct": candidate.proposal.expected_share_pct,
                "predicted_gain_pct": predicted_gain_pct(candidate.proposal.expected_share_pct)}

    def _try(self, candidate: search.Candidate, extra: Optional[dict[str, Any]] = None) -> bool:
        cfg = self._trial_config(self._candidate_config(candidate))
        context = {**self._context(candidate), **(extra or {})}
        against_s = self.best_row["wall_s"]
        # Every trial is stopped (status timeout) when it would pass the budget: the budget is a promise.
        row, result = self._trial(cfg, self.measure, candidate.label, context, judge_against=self.best,
                                  time_limit_s=self.time_left_s())
        self.chain.append(row)
        if self.compile_extra_s is None and candidate.option == "compile" and candidate.value == "default" \
                and row["status"] in (OK, QUALITY_FAIL):
            # kept or not, it tells what the other modes will cost: its compile step, and its whole extra time
            self.plain_trial_s, self.compile_extra_s = against_s, max(0.0, row["wall_s"] - against_s)
        if row["decision"]["kept"]:
            self.best_cfg = cfg
            self.best, self.best_row = result, row
            self.settled.difference_update(self.retries.release())
        return row["decision"]["kept"]

    def _trial(self, cfg: RunConfig, kind: str, label: str, context: Optional[dict[str, Any]] = None,
               judge_against: Optional[Result] = None, time_limit_s: Optional[float] = None,
               serve_cfg: Optional[ServeConfig] = None) -> tuple[dict[str, Any], Optional[Result]]:
        """Run (or reuse from tune.jsonl) one trial; record it, with its decision, before returning. A serve trial
        runs under the best serve settings, or `serve_cfg`."""
        serve_cfg = serve_cfg or self.serve_cfg
        key = trial_key(cfg, kind, serve_cfg if kind == SERVE else None)
        name = f"{self.count:02d}-{_slug(label)}"
        row = self.journal.get(key)
        reused = row is not None
        if row is None:
            self.observer.trial_started(name, kind)
            limit = {} if time_limit_s is None else {"time_limit_s": max(MIN_TRIAL_LEFT_S, time_limit_s)}
            if kind == SERVE:
                limit["serve"] = serve_cfg
            began = time.perf_counter()
            try:
                outcome = self.runner(cfg, kind, self.out / TRIALS_DIR / name, **limit)
            finally:
                self.fresh_trial_s += time.perf_counter() - began
            row = self._row(key, name, kind, label, cfg, outcome, context or {})
            if row.get("stage") == SCREEN and row.get("reference_throughput"):
                row["screened_gain_pct"] = gain_pct(row.get("throughput"), row["reference_throughput"])
            if judge_against is not None:
                decision = self._judge(judge_against, outcome)
                row["decision"] = decision.to_dict()
                row["measured_gain_pct"] = decision.gain_pct
            self.journal.append(row)
            result = outcome.result
        else:
            result = self._load(row)
        if key not in self.charged:  # a row reused within this session (a screen as a reference) costs nothing
            self.recorded_s += row["wall_s"]
            self.charged.add(key)
        self.count += 1
        self.observer.trial_finished(row, reused)
        if not reused and self.on_record is not None:
            self.on_record()  # tune.json (the best confirmed recipe) is current after every trial
        return row, result

    def _judge(self, best: Result, outcome: TrialOutcome) -> Decision:
        if outcome.result is None:
            return not_measured(outcome.status, outcome.reason)
        s = self.settings
        if self.measure == SERVE:
            return judge_max_qps(best, outcome.result, s.min_effect_pct)
        return judge(best, outcome.result, s.min_effect_pct, s.max_p99_ms, s.max_memory_gb, s.accept_noisy)

    def _row(self, key: str, name: str, kind: str, label: str, cfg: RunConfig, outcome: TrialOutcome,
             context: dict[str, Any]) -> dict[str, Any]:
        return {"index": self.count, "key": key, "name": name, "kind": kind, "label": label,
                "dir": f"{TRIALS_DIR}/{name}", "status": outcome.status, "reason": outcome.reason,
                "wall_s": round(outcome.wall_s, 3), **trial_figures(outcome), **context,
                "config": cfg.to_dict(), "created_unix": time.time()}

    def _load(self, row: dict[str, Any]) -> Optional[Result]:
        path = self.out / row["dir"] / "result.json"
        if row["status"] not in (OK, QUALITY_FAIL):
            return None
        if not path.is_file():
            raise PerflabError(f"{path} is missing but tune.jsonl records it; restore it or start a new tune")
        return Result.load(path)

    # ------------------------------------------------------------------------------------------ diagnosis

    def _profile_and_diagnose(self) -> Any:
        """Profile the current best in its own process and diagnose its trace (levers that lost excluded)."""
        # The diagnosis reads the profiled steps only (the loader's queue is drained before them): a trial of
        # just the profiler's schedule is enough, not --steps or --min-trial-s of timed steps.
        cfg = self.best_cfg.replace(trials=1, check_quality=False, steps=min(self.best_cfg.steps, PROFILE_STEPS),
                                    min_trial_s=0.0)
        row, result = self._trial(cfg, "profile", f"profile-{self.best_row['label']}", time_limit_s=self.time_left_s())
        self.last_profile_s = row["wall_s"]
        entry = {"trial": row["name"], "after": self.best_row["name"], "status": row["status"]}
        diagnosis = None
        trace = self.out / row["dir"] / "trace.json"
        if row["status"] == OK and trace.is_file():
            diagnosis = self.diagnoser(trace, result, list(self.lost))
            entry.update(bottleneck=diagnosis.bottleneck, confidence=diagnosis.confidence,
                         headline=diagnosis.headline, levers=list(diagnosis.levers),
                         findings=[{key: f.get(key) for key in ("cls", "confidence", "expected_gain_pct", "levers")}
                                   for f in diagnosis.findings])
        else:
            entry["headline"] = f"no diagnosis ({row['status']}: {row['reason']}); trying every applicable lever"
        self.diagnoses.append(entry)
        self.observer.note(f"diagnosis of {self.best_row['name']}: {entry.get('bottleneck', 'none')} — "
                           f"{entry['headline']}")
        return diagnosis

    def _verdict(self) -> Optional[str]:
        return None if self.diagnosis is None else self.diagnosis.bottleneck

    def _near_peak(self) -> bool:
        if self.diagnosis is None or self.best is None:
            return False
        busy = ((self.diagnosis.profile or {}).get("gpu") or {}).get("busy_pct")
        mfu = self.best.metrics.flops.mfu_pct if self.best.metrics.flops else None
        return busy is not None and mfu is not None and busy >= NEAR_PEAK_BUSY_PCT and mfu >= NEAR_PEAK_MFU_PCT

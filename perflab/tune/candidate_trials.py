"""A candidate's trial: whether best + candidate can run here, its config and tune.jsonl context, and its full trial
judged against the best (kept when it wins). Shared by the one-stage search (driver.py) and the confirmations of
the two-stage round (screening.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from perflab.config import RunConfig
from perflab.results import Result
from perflab.tune import candidates as search
from perflab.tune import ordering
from perflab.tune.budget import Budget
from perflab.tune.candidates import CompileCost, WorkloadBuilds, predicted_gain_pct
from perflab.tune.decision import Decision, judge
from perflab.tune.objective import SERVE, judge_max_qps, serve_refusal
from perflab.tune.record import Judge, TrialRecord, TrialRecorder, TrialRequest
from perflab.tune.retry import NoiseRetries
from perflab.tune.search_state import SearchState
from perflab.tune.settings import TuneConfig, strict_tolerances
from perflab.tune.trial import TrialOutcome, lengthened


def trial_judge(settings: TuneConfig, measure: str) -> Judge:
    """How a trial is judged against the best: by max QPS for a serve trial, by compare (and the constraints)
    otherwise."""
    def judge_trial(best: Result, outcome: TrialOutcome) -> Decision:
        if measure == SERVE:
            return judge_max_qps(best, outcome.result, settings.min_effect_pct)
        return judge(best, outcome.result, settings.min_effect_pct, settings.max_p99_ms, settings.max_memory_gb,
                     settings.accept_noisy)
    return judge_trial


def refuse(skipped: dict[str, str], observer: Any, label: str, lever: str, reason: str) -> None:
    """Record why `label` is not tried (tune.json's skipped); say it unless another value of the same lever was
    refused for the same reason (workers=2, 4, 8, 16, 32 on batches staged on the device: one line, not five)."""
    if label in skipped:
        return
    said = any(why == reason for other, why in skipped.items() if other == lever or other.startswith(lever + "="))
    skipped[label] = reason
    if not said:
        observer.note(f"not trying {label}: {reason}")


class CandidateTrials:
    """Runs and records the trials of candidates against the best in `state`; a kept one becomes the best.
    `verdict` gives the last diagnosis's bottleneck (tune.jsonl records it beside each candidate)."""

    def __init__(self, state: SearchState, settings: TuneConfig, measure: str, levers: dict[str, Any],
                 workloads: WorkloadBuilds, recorder: TrialRecorder, budget: Budget, observer: Any,
                 verdict: Callable[[], Optional[str]]):
        self.state, self.settings, self.measure, self.levers = state, settings, measure, levers
        self.workloads, self.recorder, self.budget, self.observer = workloads, recorder, budget, observer
        self.verdict = verdict
        self.compile_cost = CompileCost()
        self.retries = NoiseRetries()  # inside the noise against a large prediction: once more after a keep

    def can_try(self, candidate: search.Candidate, estimate_cost: bool = True) -> bool:
        """Whether the candidate can run here (and, with `estimate_cost`, a compile mode's full trial fits the budget
        left; the screener estimates its own trials); records why not under `skipped`."""
        state, lever = self.state, self.levers.get(candidate.lever)
        cfg = self.candidate_config(candidate)
        reason = search.refusal_before_trying(candidate, cfg, lever, self.workloads.for_config)
        if reason is None and self.measure == SERVE:
            reason = serve_refusal(candidate.option)
        if reason is None and candidate.search == search.ONCE:
            reason = ordering.replaces_kept(candidate.option, candidate.value, state.best_cfg, state.start)
        if reason is None and search.compiles(lever) and estimate_cost:
            reason = self.compile_cost.over_budget(candidate.value, state.best_row.wall_s, self.budget.left_s())
        if reason is None:
            reason = search.covered_by_kept(candidate, lever, state.best_cfg)
        if reason is not None:
            refuse(state.skipped, self.observer, candidate.label, candidate.lever, reason)
            return False
        return True

    def candidate_config(self, candidate: search.Candidate) -> RunConfig:
        """The best with the candidate applied (with the warm-up its value needs: a compile mode's compilation)."""
        return candidate.apply(self.state.best_cfg)

    def trial_config(self, cfg: RunConfig) -> RunConfig:
        """A candidate runs with the quality gate on; --quality strict halves the tolerance of its precision."""
        start = self.state.start
        cfg = cfg.replace(check_quality=True, quality_rtol=start.quality_rtol,
                          quality_loss_rtol=start.quality_loss_rtol)
        if self.settings.quality == "strict":
            cfg = cfg.replace(**strict_tolerances(cfg))
        return cfg

    def context(self, candidate: search.Candidate) -> dict[str, Any]:
        """What tune.jsonl records of a candidate beside its figures: the lever, who proposed it, the prediction."""
        return {"lever": candidate.lever, "label": candidate.label, "option": candidate.option,
                "value": candidate.value, "search": candidate.search, "against": self.state.best_row.name,
                "bottleneck": self.verdict(), "proposed_by": candidate.proposal.source,
                "finding_confidence": candidate.proposal.confidence,
                "predicted_step_share_pct": candidate.proposal.expected_share_pct,
                "predicted_gain_pct": predicted_gain_pct(candidate.proposal.expected_share_pct)}

    def try_candidate(self, candidate: search.Candidate, extra: Optional[dict[str, Any]] = None,
                      trials: Optional[tuple[int, float]] = None, longer: float = 1.0) -> bool:
        """A full trial of best + candidate, judged against the best and kept when it wins; `trials`: (--trials,
        --min-trial-s) of a confirmation sized to the budget left; `longer`: each trial that many times longer (its
        steps and --min-trial-s; the kept configuration keeps its own)."""
        state = self.state
        cfg = self.trial_config(self.candidate_config(candidate))
        if trials is not None:
            cfg = cfg.replace(trials=trials[0], min_trial_s=trials[1])
        measured_cfg = lengthened(cfg, longer)
        against_s = state.best_row.wall_s
        # Every trial is stopped (status timeout) when it would pass the budget: the budget is a promise.
        context = {**self.context(candidate), **(extra or {})}
        record = self.record(TrialRequest(measured_cfg, self.measure, candidate.label, context,
                                          judge_against=state.best, time_limit_s=self.budget.left_s()))
        state.chain.append(record.row)
        if search.measures_compile_cost(candidate, self.levers.get(candidate.lever)) and record.row.measured:
            self.compile_cost.measured(against_s, record.row.wall_s)  # what the other modes will cost
        if record.kept:
            state.keep(cfg, record)
            state.settled.difference_update(self.retries.release())
        return record.kept

    def record(self, request: TrialRequest) -> TrialRecord:
        """Run (or reuse from tune.jsonl) one trial and record it; a serve trial runs under the best serve
        settings unless the request names others."""
        if request.kind == SERVE and request.serve_cfg is None:
            request = dataclasses.replace(request, serve_cfg=self.state.serve_cfg)
        return self.recorder.record(request)

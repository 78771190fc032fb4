"""The profile-and-diagnose step of a round: profile the best in its own process, diagnose its trace, and say what
the round proposes from it.

A profile gets at most PROFILE_SHARE of the budget (a step that launches thousands of kernels made one take 65 s of a
90-s budget); one cut at that limit leaves no trace to diagnose, and the round screens the insurance levers with the
levers the best's own phase timing names (perflab/diagnose/phase_shares.py: an optimizer step that holds half of
the step names the foreach and fused optimizers).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Optional

from perflab.config import RunConfig
from perflab.diagnose import diagnose, diagnose_result
from perflab.results import Result
from perflab.tune import candidates as search
from perflab.tune.budget import Budget
from perflab.tune.record import TrialRecorder, TrialRequest
from perflab.tune.rows import TrialRow
from perflab.tune.screen_order import insurance_proposals
from perflab.tune.summary import DiagnosisEntry
from perflab.tune.trial import OK, PROFILE_STEPS, TIMEOUT

NEAR_PEAK_BUSY_PCT = 95.0
NEAR_PEAK_MFU_PCT = 70.0  # share of the calibrated peak that counts as "near it"
# A profile trial may take this share of the budget: on an H200, 600 small tensors updated by Adam(foreach=False)
# launched 6,900 kernels a step, and the start's profile ran 65 s of a 90-s budget, leaving nothing to try.
PROFILE_SHARE = 0.15
# A step that launched this many kernels (its last profile says so), or whose last profile was cut, is profiled
# for one active step instead of three: the profiler's cost grows with the events it records and exports.
MANY_KERNELS_PER_STEP = 2000
SHORT_PROFILE_STEPS = 3  # wait 1, warm-up 1, active 1 (perflab/tune/trial.py profile_capture)
FINDING_KEYS = ("cls", "confidence", "expected_gain_pct", "levers")  # what tune.json's diagnoses keep of a finding

Diagnoser = Callable[[Path, Optional[Result], list[str]], Any]


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


class Profiler:
    """Profiles and diagnoses the best of each round; keeps every diagnosis for tune.json and the last one for the
    round's proposals. `notes` is the tune's notes (a cut profile is said there)."""

    def __init__(self, out: Path, recorder: TrialRecorder, budget: Budget, diagnoser: Diagnoser,
                 levers: dict[str, Any], notes: list[str], observer: Any):
        self.out, self.recorder, self.budget, self.diagnoser = out, recorder, budget, diagnoser
        self.levers, self.notes, self.observer = levers, notes, observer
        self.diagnoses: list[DiagnosisEntry] = []
        self.diagnosis: Any = None  # the last one (None before one, or when the profile gave no trace)
        self.phase_diagnosis: Any = None  # the best's phase timing diagnosed, when its profile was cut
        self.last_profile_s: Optional[float] = None  # wall time of the last profile trial
        self.profile_cut: Optional[str] = None  # what became of a profile cut at its limit (the stop line says it)

    def profile_and_diagnose(self, best_cfg: RunConfig, best_row: TrialRow, lost: list[str]) -> Any:
        """Profile the current best in its own process, within PROFILE_SHARE of the budget, and diagnose its trace
        (levers that lost excluded); None when the profile gave no trace."""
        # The diagnosis reads the profiled steps only (the loader's queue is drained before them): a trial of
        # just the profiler's schedule is enough, not --steps or --min-trial-s of timed steps.
        steps = profile_steps(best_cfg.steps, self.kernels_per_step(), self.last_profile_cut())
        cfg = best_cfg.replace(trials=1, check_quality=False, steps=steps, min_trial_s=0.0)
        limit_s = min(self.budget.left_s(), self.budget.share_s(PROFILE_SHARE))
        record = self.recorder.record(TrialRequest(cfg, "profile", f"profile-{best_row.label}", time_limit_s=limit_s))
        row = record.row
        self.last_profile_s = row.wall_s
        entry = DiagnosisEntry(row.name, best_row.name, row.status, steps)
        diagnosis = None
        trace = self.out / row.dir / "trace.json"
        if row.status == OK and trace.is_file():
            diagnosis = self.diagnoser(trace, record.result, list(lost))
            entry.bottleneck, entry.confidence = diagnosis.bottleneck, diagnosis.confidence
            entry.headline, entry.levers = diagnosis.headline, list(diagnosis.levers)
            entry.findings = [{key: getattr(f, key, None) for key in FINDING_KEYS} for f in diagnosis.findings]
        elif row.status == TIMEOUT:
            self.phase_diagnosis = self._phase_diagnosis(best_row, lost)
            entry.cut, entry.headline = True, self._profile_was_cut(best_row.label, limit_s)
        else:
            entry.headline = f"no diagnosis ({row.status}: {row.reason}); trying every applicable lever"
        self.diagnoses.append(entry)
        self.observer.note(f"diagnosis of {best_row.name}: {entry.bottleneck or 'none'} — {entry.headline}")
        self.diagnosis = diagnosis
        return diagnosis

    def _phase_diagnosis(self, best_row: TrialRow, lost: list[str]) -> Any:
        """The diagnosis of the best's own result (its phase timing), for a round whose profile was cut; None
        without a saved result."""
        path = self.out / best_row.dir / "result.json" if best_row.dir else None
        if path is None or not path.is_file():
            return None
        return diagnose_result(Result.load(path.parent), list(lost))

    def _profile_was_cut(self, label: str, limit_s: float) -> str:
        """A profile stopped at its limit: no trace; the round screens the insurance levers and those the best's
        phase timing names. Said in the notes and the stop line."""
        names = ", ".join(proposal.lever for proposal in insurance_proposals(self.levers))
        phases = self.phase_diagnosis.findings[0] if self.phase_diagnosis and self.phase_diagnosis.findings else None
        named = (f"; first {', '.join(phases.levers[:3])}: {phases.summary.split(';')[0]}"
                 if phases is not None and phases.levers else "")
        line = (f"the profile of {label} was cut at its limit ({limit_s:.0f} s, "
                f"{PROFILE_SHARE:.0%} of the budget): no trace to diagnose, so the levers every workload is screened "
                f"with were screened instead ({names}){named}")
        self.profile_cut = line
        if line not in self.notes:
            self.notes.append(line)
        return line

    def proposals(self) -> list[search.Proposal]:
        """The levers this round proposes: the diagnosis's, or, when the profile was cut, those the best's phase
        timing names and the insurance levers."""
        if self.diagnosis is None and self.last_profile_cut():
            named = self._phase_proposals()
            known = {proposal.lever for proposal in named}
            return named + [proposal for proposal in insurance_proposals(self.levers) if proposal.lever not in known]
        return search.proposals(self.diagnosis, self.levers)

    def _phase_proposals(self) -> list[search.Proposal]:
        """The levers the phase findings name, as named proposals (nothing else: a result without a finding
        proposes no lever, where search.proposals would propose every lever for "no clear bottleneck")."""
        chosen: dict[str, search.Proposal] = {}
        for finding in getattr(self.phase_diagnosis, "findings", None) or []:
            for name in finding.levers:
                if name in self.levers and name not in chosen:
                    chosen[name] = search.Proposal(name, finding.cls, finding.confidence, finding.expected_gain_pct)
        return list(chosen.values())

    def gpu_figure(self, name: str) -> Optional[float]:
        """A figure of the GPU's share of the last diagnosis's trace profile (None before one, or without a GPU)."""
        gpu = getattr(getattr(self.diagnosis, "profile", None), "gpu", None)
        return getattr(gpu, name, None)

    def kernels_per_step(self) -> Optional[float]:
        """Kernels a step launched, as the last diagnosis counted them (None before one)."""
        return self.gpu_figure("kernels_per_step")

    def last_profile_cut(self) -> bool:
        return bool(self.diagnoses and self.diagnoses[-1].cut)

    def verdict(self) -> Optional[str]:
        """The last diagnosis's bottleneck (None without one)."""
        return None if self.diagnosis is None else self.diagnosis.bottleneck

    def advice(self) -> list[str]:
        """What the last diagnosis advises the user to do (the stop line says the first)."""
        return list(getattr(self.diagnosis, "advice", None) or [])

    def near_peak(self, best: Optional[Result]) -> bool:
        """The GPU is busy and the best's MFU is near the calibrated peak: nothing left to win."""
        if self.diagnosis is None or best is None:
            return False
        busy = self.gpu_figure("busy_pct")
        mfu = best.metrics.flops.mfu_pct if best.metrics.flops else None
        return busy is not None and mfu is not None and busy >= NEAR_PEAK_BUSY_PCT and mfu >= NEAR_PEAK_MFU_PCT

"""tune.json, typed: the objective, the start and the best, the chain of decisions, the screens, the diagnoses and
the recipe. output.py builds a TuneSummary from a Tuner and writes its dict; the report and the CLI read one back
with `TuneSummary.from_dict`, which tolerates the keys an older tune.json lacks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from perflab.tune.recipe import Recipe
from perflab.results.records import Record
from perflab.tune.rows import MemoryTrade, TrialRow
from perflab.tune.settings import MAX_QPS


@dataclass
class ObjectiveSummary(Record):
    """What the search raised: its name, the figure (a row key) and its unit; for max-qps the bound and the
    resolution."""

    name: str = "throughput"
    figure: str = "throughput"
    unit: str = "samples/s"
    p99_ms: Optional[float] = None
    resolution_pct: Optional[float] = None
    min_effect_pct: Optional[float] = None
    serve: Optional[dict[str, Any]] = None  # the serve settings (max-qps)

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"name": self.name, "figure": self.figure, "unit": self.unit}
        if self.serve is not None:
            record.update(p99_ms=self.p99_ms, resolution_pct=self.resolution_pct, min_effect_pct=self.min_effect_pct,
                          serve=self.serve)
        return record


SIDE_KEYS = ("name", "label", "dir", "throughput", "throughput_ci95", "max_qps", "resolution_pct", "p50_ms", "p99_ms",
             "peak_memory_mb", "mfu_pct", "quality")


@dataclass
class Side(Record):
    """The start or the best: which trial it is and its figures."""

    name: Optional[str] = None
    label: Optional[str] = None
    dir: Optional[str] = None
    throughput: Optional[float] = None
    throughput_ci95: Optional[list[Optional[float]]] = None
    max_qps: Optional[float] = None
    resolution_pct: Optional[float] = None
    p50_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    mfu_pct: Optional[float] = None
    quality: Optional[str] = None

    @classmethod
    def of(cls, row: TrialRow) -> "Side":
        return cls(**{key: getattr(row, key) for key in SIDE_KEYS})

    def figure(self, key: str) -> Optional[float]:
        return getattr(self, key, None)

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in SIDE_KEYS}


# What a chain link copies from its trial's row, in tune.json's order.
CHAIN_KEYS = ("name", "lever", "label", "bottleneck", "proposed_by", "finding_confidence", "predicted_step_share_pct",
              "predicted_gain_pct", "measured_gain_pct", "status", "throughput", "max_qps", "p99_ms", "peak_memory_mb",
              "wall_s", "warmup_s", "compile_s", "against", "dir", "stage", "screened_gain_pct", "screen_trial",
              "confirmation", "trade", "warm")


@dataclass
class ChainLink(Record):
    """One decision of the chain, flat enough to read in tune.json and to print as a table row: the trial's lever,
    prediction and figures, and its decision (kept or why not)."""

    name: str = ""
    lever: Optional[str] = None
    label: str = ""
    bottleneck: Optional[str] = None
    proposed_by: Optional[str] = None
    finding_confidence: Optional[float] = None
    predicted_step_share_pct: Optional[float] = None
    predicted_gain_pct: Optional[float] = None
    measured_gain_pct: Optional[float] = None
    status: Optional[str] = None
    throughput: Optional[float] = None
    max_qps: Optional[float] = None
    p99_ms: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    wall_s: Optional[float] = None
    warmup_s: Optional[float] = None
    compile_s: Optional[float] = None
    against: Optional[str] = None
    dir: Optional[str] = None
    stage: Optional[str] = None
    screened_gain_pct: Optional[float] = None
    screen_trial: Optional[str] = None
    confirmation: Optional[dict[str, Any]] = None
    trade: Optional[MemoryTrade] = None
    warm: Optional[bool] = None
    # the decision
    ci95_pct: Optional[list[Optional[float]]] = None
    quality: Optional[str] = None
    verdict: Optional[str] = None
    kept: bool = False
    why: Optional[str] = None
    judged: bool = True
    # max-qps: what the candidate's max QPS was judged against, and how finely
    objective: Optional[str] = None
    against_max_qps: Optional[float] = None
    resolution_pct: Optional[float] = None

    @classmethod
    def of(cls, row: TrialRow) -> "ChainLink":
        link = cls(**{key: getattr(row, key) for key in CHAIN_KEYS})
        decision = row.decision
        if decision is None:
            return link
        link.ci95_pct, link.quality, link.verdict = decision.ci95_pct, decision.quality, decision.verdict
        link.kept, link.why, link.judged = decision.kept, decision.why, decision.judged
        if decision.objective == MAX_QPS:
            link.objective, link.against_max_qps = MAX_QPS, decision.against_value
            link.resolution_pct = decision.resolution_pct
        return link

    def figure(self, key: str) -> Optional[float]:
        return getattr(self, key, None)

    def to_dict(self) -> dict[str, Any]:
        link = {key: getattr(self, key) for key in CHAIN_KEYS}
        link.update(trade=self.trade.to_dict() if self.trade is not None else None, ci95_pct=self.ci95_pct,
                    quality=self.quality, verdict=self.verdict, kept=self.kept, why=self.why, judged=self.judged)
        if self.objective is not None:
            link.update(objective=self.objective, against_max_qps=self.against_max_qps,
                        resolution_pct=self.resolution_pct)
        return link


@dataclass
class ScreenEntry(Record):
    """One candidate's screen in tune.json: its trial, its gain over the round's reference, and what became of it."""

    label: str = ""
    lever: Optional[str] = None
    trial: Optional[str] = None
    status: Optional[str] = None
    screened_gain_pct: Optional[float] = None
    win: bool = False
    outcome: str = ""  # confirmed | rejected at confirmation: why | not confirmed: budget | no win
    wall_s: Optional[float] = None
    compile_s: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "lever": self.lever, "trial": self.trial, "status": self.status,
                "screened_gain_pct": self.screened_gain_pct, "win": self.win, "outcome": self.outcome,
                "wall_s": self.wall_s, "compile_s": self.compile_s}


@dataclass
class DiagnosisEntry(Record):
    """One profile of the best and what its diagnosis said (or why there was none: the profile was cut, failed)."""

    trial: Optional[str] = None
    after: Optional[str] = None  # the trial whose config was profiled
    status: Optional[str] = None
    steps: Optional[int] = None
    bottleneck: Optional[str] = None
    confidence: Optional[float] = None
    headline: str = ""
    levers: Optional[list[str]] = None
    findings: Optional[list[dict[str, Any]]] = None
    cut: bool = False  # the profile was stopped at its limit

    def to_dict(self) -> dict[str, Any]:
        """As tune.json holds it: the diagnosis's figures where there was one, `cut` where the profile was."""
        entry: dict[str, Any] = {"trial": self.trial, "after": self.after, "status": self.status, "steps": self.steps}
        if self.levers is not None:
            entry.update(bottleneck=self.bottleneck, confidence=self.confidence)
        entry.update(headline=self.headline)
        if self.levers is not None:
            entry.update(levers=self.levers, findings=self.findings or [])
        if self.cut:
            entry.update(cut=True)
        return entry


@dataclass
class TuneSummary(Record):
    """Everything tune.json holds (read back by from_dict: an older one may lack any entry; check its figures first,
    perflab/report/tune.py check_tune_record)."""

    objective: ObjectiveSummary = field(default_factory=ObjectiveSummary)
    command: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    budget_s: Optional[float] = None
    spent_s: Optional[float] = None
    compile_and_warmup_s: Optional[float] = None
    compile_s: Optional[float] = None  # measured, per trial
    screened: list[ScreenEntry] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)  # each screened win left unconfirmed, described
    trials: Optional[int] = None
    warm_trials: Optional[int] = None  # run by the warm worker (perflab/tune/warm.py)
    stop_reason: str = ""  # the stop line
    stop: Optional[dict[str, str]] = None  # StopReason.to_dict(); None while the tune runs
    profile_cut: Optional[str] = None
    start: Optional[Side] = None
    best: Optional[Side] = None
    speedup: Optional[float] = None
    kept: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    diagnoses: list[DiagnosisEntry] = field(default_factory=list)
    chain: list[ChainLink] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_judged: Optional[str] = None
    recipe: Recipe = field(default_factory=Recipe)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "tune", "command": self.command, "objective": self.objective.to_dict(), "settings": self.settings,
            "budget_s": self.budget_s, "spent_s": self.spent_s, "compile_and_warmup_s": self.compile_and_warmup_s,
            "compile_s": self.compile_s, "screened": [entry.to_dict() for entry in self.screened],
            "unconfirmed": self.unconfirmed, "trials": self.trials, "warm_trials": self.warm_trials,
            "stop_reason": self.stop_reason, "stop": self.stop, "profile_cut": self.profile_cut,
            "start": self.start.to_dict() if self.start is not None else None,
            "best": self.best.to_dict() if self.best is not None else None,
            "speedup": self.speedup, "kept": self.kept, "lost": self.lost, "skipped": self.skipped,
            "diagnoses": [entry.to_dict() for entry in self.diagnoses],
            "chain": [link.to_dict() for link in self.chain], "notes": self.notes, "not_judged": self.not_judged,
            "recipe": self.recipe.to_dict(),
        }

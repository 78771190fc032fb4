"""A trial of a tune, typed: its tune.jsonl line (TrialRow), with its decision and, for the memory-for-batch pair,
its trade. Kept typed in memory and read as attributes; a dict only when written (Journal.append) and parsed back
from one on --resume, tolerating the keys an older tune.jsonl lacks (and keeping those it adds).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from perflab.tune.decision import Decision
from perflab.results.records import Record, build, unknown_keys
from perflab.tune.trial import OK, QUALITY_FAIL


@dataclass
class MemoryTrade(Record):
    """Activation checkpointing traded for a larger batch (perflab/tune/memory_trade.py): the batches behind the pair,
    what the estimate rests on, and its outcome once judged."""

    batch_ran: int = 0  # the largest batch that ran without checkpointing
    batch_out_of_memory: int = 0
    batch_tried: int = 0  # with checkpointing on
    basis: str = ""
    verdict: Optional[str] = None  # kept, or why not (trade_verdict)

    def to_dict(self) -> dict[str, Any]:
        record = {"batch_ran": self.batch_ran, "batch_out_of_memory": self.batch_out_of_memory,
                  "batch_tried": self.batch_tried, "basis": self.basis}
        return record if self.verdict is None else {**record, "verdict": self.verdict}


@dataclass
class TrialRow:
    """One finished trial, as tune.jsonl records it: what ran, its figures, what tune said of it beside them (the
    lever, who proposed it, the prediction, the stage), and its decision when it was judged against the best."""

    index: int = 0
    key: str = ""
    name: str = ""
    kind: str = ""  # run | profile | serve
    label: str = ""
    dir: str = ""  # the trial's run folder, relative to the tune folder
    status: str = ""
    reason: Optional[str] = ""
    wall_s: float = 0.0
    warm: bool = False  # run by the warm worker
    setup_s: Optional[float] = None  # of wall_s, the warm worker's start it paid: not a cost of a later trial
    # figures (perflab/tune/trial.py trial_figures; a serve trial's, perflab/tune/objective.py serve_figures)
    throughput: Optional[float] = None
    throughput_ci95: Optional[list[Optional[float]]] = None
    p50_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    warmup_s: Optional[float] = None
    compile_s: Optional[float] = None
    timed_s: Optional[float] = None
    mfu_pct: Optional[float] = None
    quality: Optional[str] = None
    max_qps: Optional[float] = None
    resolution_pct: Optional[float] = None
    achieved_qps: Optional[float] = None
    batch_fill_pct: Optional[float] = None
    single_query_ms: Optional[float] = None
    dispatch_delay_p99_ms: Optional[float] = None
    harness_late_points: Optional[int] = None
    search_skipped: Optional[str] = None
    # what tune says of a candidate (Tuner.context) and of its stage (screening)
    lever: Optional[str] = None
    option: Optional[str] = None
    value: Any = None
    search: Optional[str] = None
    against: Optional[str] = None  # the name of the trial it was read against
    bottleneck: Optional[str] = None
    proposed_by: Optional[str] = None
    why_proposed: Optional[str] = None
    finding_confidence: Optional[float] = None
    predicted_step_share_pct: Optional[float] = None
    predicted_gain_pct: Optional[float] = None
    stage: Optional[str] = None  # screen | confirm | None (a one-stage trial)
    reference: Optional[bool] = None  # a round's reference screen of the best
    reference_throughput: Optional[float] = None
    screened_gain_pct: Optional[float] = None
    screen_trial: Optional[str] = None
    confirmation: Optional[dict[str, Any]] = None  # ConfirmationSize.to_dict()
    trade: Optional[MemoryTrade] = None
    config: dict[str, Any] = field(default_factory=dict)
    created_unix: Optional[float] = None
    decision: Optional[Decision] = None
    measured_gain_pct: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, written back as read

    @property
    def kept(self) -> bool:
        return self.decision is not None and self.decision.kept

    @property
    def measured(self) -> bool:
        """It produced a result (passing the quality gate or not)."""
        return self.status in (OK, QUALITY_FAIL)

    @property
    def judged(self) -> bool:
        """compare reached a verdict on it (True without a decision: nothing said otherwise)."""
        return self.decision is None or self.decision.judged

    def figure(self, key: str) -> Optional[float]:
        """The figure an objective raises (throughput, max_qps), by its row key."""
        return getattr(self, key, None)

    def to_dict(self) -> dict[str, Any]:
        """The tune.jsonl line: every field (null where unset), and the keys it was read with that it does not know."""
        row: dict[str, Any] = {}
        for declared in fields(self):
            value = getattr(self, declared.name)
            if declared.name != "extra":
                row[declared.name] = value.to_dict() if isinstance(value, (Decision, MemoryTrade)) else value
        return {**self.extra, **row}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialRow":
        """A row as read from tune.jsonl (or built from a trial's figures and context): missing keys take their
        defaults, unknown ones are kept in `extra`."""
        row = build(cls, {key: value for key, value in data.items() if key != "extra"})
        row.extra = unknown_keys(cls, data)
        return row

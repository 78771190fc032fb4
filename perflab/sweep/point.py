"""The data model of a sweep: one finished point (a line of sweep.jsonl), for `perflab scale` the same point with its
scaling efficiency, and what was swept (sweep.json). Typed in memory; a dict only where a line or a file is written or
read back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from perflab.config import RunConfig
from perflab.results import Result
from perflab.results.quality import verdict_of


def value_text(value: Any) -> str:
    """A swept value as text (tables, labels, plots): on/off for switches, none for unset."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


@dataclass
class SweepPoint:
    """One finished point: what was run (its swept values and resolved config), how it ended, and its figures
    (None where the point did not finish ok)."""

    index: int = 0
    key: str = ""  # point_key of the resolved config
    label: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # the swept values, always with batch_size
    config: RunConfig = field(default_factory=RunConfig)
    status: str = ""  # ok, oom, invalid (diverged: NaN/inf) or error
    error: Optional[str] = None
    out_of_memory: Optional[dict[str, Any]] = None  # an oom point's OutOfMemory record
    dir: Optional[str] = None  # the point's folder, relative to the sweep's
    throughput: Optional[float] = None
    throughput_ci_low: Optional[float] = None
    throughput_ci_high: Optional[float] = None
    trials: Optional[int] = None
    p50_ms: Optional[float] = None
    p95_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    memory_kind: Optional[str] = None
    gpu_util_pct: Optional[float] = None
    mfu_pct: Optional[float] = None
    quality: Optional[str] = None  # the quality gate's verdict
    quality_reason: Optional[str] = None
    busy: bool = False  # timed beside other busy processes
    world_size: Optional[int] = None
    elapsed_s: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this perflab does not know, kept as they were read

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def throughput_uncertainty(self) -> Optional[float]:
        """Half the 95% interval of the throughput as a share of it (0.02: +/-2%), or None where it has none."""
        if not self.throughput or self.throughput_ci_low is None or self.throughput_ci_high is None:
            return None
        return (self.throughput_ci_high - self.throughput_ci_low) / 2 / self.throughput

    def to_dict(self) -> dict[str, Any]:
        """The line of sweep.jsonl (the config as RunConfig.to_dict), for writing or a reader of dicts."""
        data = {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.name != "extra"}
        return {**self.extra, **data, "config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepPoint":
        """A line of sweep.jsonl (or a row of scale.json, as a ScaleRow), from any perflab version: missing keys take
        their defaults, unknown ones are kept in `extra`."""
        known = {item.name for item in dataclasses.fields(cls)} - {"extra", "config"}
        values = {name: value for name, value in data.items() if name in known}
        unknown = {name: value for name, value in data.items() if name not in known and name != "config"}
        busy = bool(values.pop("busy", False))  # a line from before the busy signal
        return cls(**values, busy=busy, config=RunConfig.from_dict(data.get("config") or {}), extra=unknown)


def measured_figures(result: Result) -> dict[str, Any]:
    """The flat summary of one point's result that a SweepPoint (and sweep.jsonl, sweep.csv) holds, by field name."""
    m = result.metrics
    throughput, latency = m.throughput_samples_per_s, m.latency_ms
    return dict(throughput=throughput.median, throughput_ci_low=throughput.ci95_low,
                throughput_ci_high=throughput.ci95_high, trials=throughput.n, p50_ms=latency.p50, p95_ms=latency.p95,
                p99_ms=latency.p99, peak_memory_mb=result.peak_memory.mb, memory_kind=result.peak_memory.label,
                gpu_util_pct=m.gpu.util_mean_pct if m.gpu else None, mfu_pct=m.flops.mfu_pct if m.flops else None,
                quality=verdict_of(result.quality, None),
                quality_reason=result.quality.reason if result.quality is not None else None,
                busy=bool(m.interference and m.interference.busy), world_size=result.world_size)


@dataclass
class ScaleRow(SweepPoint):
    """A point of `perflab scale`: world_size is nproc x nnodes; per-rank throughput and the efficiency against its
    group's 1-rank point (None where it did not finish ok, or has no 1-rank point); flags say why its figures cannot
    be trusted."""

    per_rank_throughput: Optional[float] = None
    efficiency_pct: Optional[float] = None
    flags: list[str] = field(default_factory=list)

    @classmethod
    def of_point(cls, point: SweepPoint) -> "ScaleRow":
        """The point with its world size, before any efficiency is known."""
        values = {item.name: getattr(point, item.name) for item in dataclasses.fields(SweepPoint)
                  if item.name != "world_size"}
        return cls(**values, world_size=point.config.nproc * (point.config.nnodes or 1))


@dataclass
class SweepMeta:
    """sweep.json: what was swept (the axes, the grid or the auto-batch search over a base config), the latency
    bound, and the best points so far."""

    kind: str = "sweep"
    mode: Optional[str] = None  # "grid" or "auto-batch"
    axes: list[str] = field(default_factory=list)
    base_config: dict[str, Any] = field(default_factory=dict)  # RunConfig.to_dict of the first point, resolved
    command: list[str] = field(default_factory=list)
    max_p95_ms: Optional[float] = None
    points_planned: Optional[int] = None  # a grid's point count; None for auto-batch
    points_done: int = 0
    growth_pct: Optional[float] = None  # auto-batch only
    max_batch: Optional[int] = None  # auto-batch only
    best: Optional[str] = None  # the best point's key
    best_under_bound: Optional[str] = None
    plots: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this perflab does not know, kept as they were read

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepMeta":
        """sweep.json as saved by any perflab version: missing or null keys take their defaults, unknown ones are
        kept in `extra`."""
        known = {item.name for item in dataclasses.fields(cls)} - {"extra"}
        values = {name: value for name, value in data.items() if name in known and value is not None}
        return cls(**values, extra={name: value for name, value in data.items() if name not in known})

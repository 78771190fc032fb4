"""Findings: what one rule concludes (in a class of the bottleneck map, perflab.bottlenecks), and the rules' shared
inputs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from perflab.diagnose.operators import OperatorView
from perflab.results.records import Record
from perflab.diagnose.summary import TraceProfile
from perflab.diagnose.trace import ParsedTrace
from perflab.results.metrics import Metrics
from perflab.levers import cuda_only_levers
# On a CPU trace the op-mix rules (compute, memory bandwidth) read time shares only, with no device timeline
# or roofline behind them, so they claim less than rules with a direct signal (data wait, syncs).
CPU_MAX_CONFIDENCE = 0.85


@dataclass
class Finding(Record):
    """One rule's conclusion: a class from the map, how sure, the numbers behind it, what to try, and how much
    of the step it explains."""

    cls: str
    confidence: float  # 0..1
    summary: str
    evidence: dict[str, Any]
    levers: list[str]  # lever names (`perflab levers`), best first
    advice: list[str] = field(default_factory=list)  # actions that are not levers (remove a sync, cache data)
    # The share of the step this cause accounts for: the step time to expect back if it were removed entirely
    # (a step 40% shorter is 1/(1 - 0.4) = 1.67x faster). gain_basis says what was measured. None: a finding
    # loaded from a diagnosis.json written before gains were measured.
    expected_gain_pct: Optional[float] = 0.0
    gain_basis: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return super().from_dict({"expected_gain_pct": None, **data})


def by_expected_gain(levers: list[str], gains: dict[str, float]) -> list[str]:
    """Levers with a predicted gain first, largest first; the rest after them in their declared order."""
    known = sorted((name for name in levers if name in gains), key=lambda name: -gains[name])
    return known + [name for name in levers if name not in gains]


@dataclass
class Context:
    """What every rule reads: the parsed trace, its summary (computed once), and the run's result if known.
    A result alone (perflab serve) has no trace: trace and profile are None and only result rules run."""

    trace: Optional[ParsedTrace]
    profile: Optional[TraceProfile]
    result: Any = None  # perflab.Result or None
    tried_and_lost: frozenset[str] = frozenset()  # levers already measured on this run that did not win
    graph: Any = None  # perflab.diagnose.op_graph.OpGraph of the window (the anti-pattern rules read it)
    operators: Optional[OperatorView] = None

    def config(self, key: str, default: Any = None) -> Any:
        if self.result is None:
            return default
        value = getattr(self.result.config, key, default)
        return default if value is None else value

    @property
    def on_gpu(self) -> bool:
        if self.profile is None:
            return self.config("device") == "cuda"
        return self.profile.gpu is not None

    @property
    def metrics(self) -> Metrics:
        return self.result.metrics if self.result is not None else Metrics()

    def rank_levers(self, names: list[str]) -> list[str]:
        """Drop levers already on in this run, levers tried and lost, and CUDA-only levers on a CPU run; keep
        the order, no repeats."""
        active = set(self.result.levers) if self.result is not None else set()
        cuda_only = cuda_only_levers()
        ranked = []
        for name in names:
            if (name in active or name in ranked or name in self.tried_and_lost
                    or (not self.on_gpu and name in cuda_only)):
                continue
            ranked.append(name)
        return ranked

    def step_pct(self, ms_per_step: float) -> float:
        """A time per step as a share of the profiled step (0-100)."""
        return min(100.0, 100 * ms_per_step / self.profile.step_ms) if self.profile.step_ms > 0 else 0.0


def dominance(share_pct: float) -> float:
    """Confidence from how much one kind of work dominates: 0.3 at half the time, 0.95 from about 75%."""
    return 0.3 + 1.3 * (share_pct - 50.0) / 50.0


def clamp(value: float, low: float = 0.0, high: float = 0.95) -> float:
    return max(low, min(high, value))


def rounded(evidence: dict[str, Any]) -> dict[str, Any]:
    """Evidence numbers to 3 significant digits (also inside dicts of counts), so diagnosis.json reads well."""
    return {key: _rounded(value) for key, value in evidence.items()}


def _rounded(value: Union[float, dict, Any]) -> Any:
    if isinstance(value, float):
        return float(f"{value:.3g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


def gain(pct: float) -> float:
    """An expected gain, clipped to 0-100% and rounded for diagnosis.json."""
    return round(max(0.0, min(100.0, pct)), 1)

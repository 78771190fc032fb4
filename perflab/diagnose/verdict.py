"""The verdict: run every rule over one parsed trace and name the bottleneck, or say there is none."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from perflab.diagnose.activation_memory import activation_memory
from perflab.diagnose.collectives import collectives
from perflab.diagnose.compute import compute_bound
from perflab.diagnose.copies import host_to_device_copies
from perflab.diagnose.decode import decode_regime
from perflab.diagnose.dominant_operator import dominant_operator
from perflab.bottlenecks import NO_CLEAR_BOTTLENECK
from perflab.diagnose.findings import Context, Finding
from perflab.diagnose.inference_queue import inference_queue
from perflab.diagnose.input_pipeline import input_pipeline
from perflab.diagnose.launch_overhead import launch_overhead
from perflab.diagnose.lost_levers import apply_tried_and_lost
from perflab.diagnose.memory_bandwidth import memory_bandwidth
from perflab.diagnose.operators import OperatorView
from perflab.diagnose.patterns import PATTERN_RULES
from perflab.diagnose.phase_shares import phase_shares
from perflab.results.records import Record
from perflab.diagnose.runtime_api import RUNTIME_API_RULES
from perflab.diagnose.summary import TraceProfile
from perflab.diagnose.sync import host_device_sync

# One function per rule family; each returns a Finding or None with its candidate levers, best first.
# Order breaks ties of confidence and expected gain.
RULES: list[Callable[[Context], Optional[Finding]]] = [
    input_pipeline, host_to_device_copies, host_device_sync, launch_overhead, activation_memory,
    memory_bandwidth, compute_bound, collectives, inference_queue, decode_regime, *PATTERN_RULES,
    *RUNTIME_API_RULES,
    dominant_operator,
]
# The rules that read only the result's metrics (a serve result, a run whose profile was cut or never taken).
RESULT_RULES: list[Callable[[Context], Optional[Finding]]] = [inference_queue, phase_shares]
MIN_CONFIDENCE = 0.5  # below this, no finding is named as the bottleneck
BUSY_ENOUGH_PCT = 95.0


@dataclass
class Diagnosis(Record):
    """The verdict (bottleneck class, confidence, evidence, ranked levers), every finding, and the trace summary."""

    bottleneck: str
    confidence: float
    headline: str
    evidence: dict[str, Any]
    levers: list[str]
    advice: list[str]
    findings: list[Finding]
    profile: Optional[TraceProfile]  # None: a diagnosis of a result alone (perflab serve)
    source: dict[str, Optional[str]] = field(default_factory=dict)
    expected_gain_pct: Optional[float] = None  # the named finding's (see Finding); None when none is named
    tried_and_lost: list[str] = field(default_factory=list)  # levers left out because they lost on this run
    operators: Optional[OperatorView] = None  # None without a trace, or in a diagnosis.json from before the view

    def __post_init__(self) -> None:
        # saved dicts handed in directly (a diagnosis planted in a test) become records as from_dict makes them
        self.findings = [f if isinstance(f, Finding) else Finding.from_dict(f) for f in self.findings]
        if isinstance(self.profile, dict):
            self.profile = TraceProfile.from_dict(self.profile) if self.profile else None
        if isinstance(self.operators, dict):
            self.operators = OperatorView.from_dict(self.operators) if self.operators else None

    def to_dict(self) -> dict[str, Any]:
        """As diagnosis.json holds it: no profile or operator view is saved as {}."""
        data = super().to_dict()
        data["profile"] = data["profile"] or {}
        data["operators"] = data["operators"] or {}
        return data


def run_rules(ctx: Context) -> list[Finding]:
    """Every rule's finding, levers ranked for this run, most confident first; equally confident findings
    (many saturate at the cap) by the share of the step they explain. A result without a trace (perflab serve)
    runs the result rules only."""
    rules = RULES if ctx.profile is not None else RESULT_RULES
    findings = [apply_tried_and_lost(ctx, finding) for rule in rules if (finding := rule(ctx)) is not None]
    return sorted(findings, key=lambda f: (-round(f.confidence, 2), -f.expected_gain_pct))


def decide(ctx: Context, findings: list[Finding]) -> Diagnosis:
    """Name the most confident finding, or 'no clear bottleneck' with what the numbers do say."""
    profile = ctx.profile
    busy = profile.gpu.busy_pct if profile is not None and profile.gpu else None
    common = {"findings": findings, "profile": profile, "tried_and_lost": sorted(ctx.tried_and_lost),
              "operators": ctx.operators}
    if findings and findings[0].confidence >= MIN_CONFIDENCE:
        top = findings[0]
        evidence = dict(top.evidence)
        if busy is not None:
            evidence.setdefault("gpu_busy_pct", round(busy, 1))
        util = ctx.metrics.gpu.util_mean_pct if ctx.metrics.gpu else None
        if util is not None:
            evidence.setdefault("nvml_util_mean_pct", round(util, 1))
        return Diagnosis(bottleneck=top.cls, confidence=round(top.confidence, 2), headline=top.summary,
                         evidence=evidence, levers=top.levers, advice=top.advice,
                         expected_gain_pct=top.expected_gain_pct, **common)
    if busy is not None and busy >= BUSY_ENOUGH_PCT:
        headline = f"no clear bottleneck (GPU busy {busy:.0f}% ≥ {BUSY_ENOUGH_PCT:.0f}%)"
        confidence = 0.8
    elif busy is not None:
        headline = f"no clear bottleneck: GPU busy {busy:.0f}%, and no rule explains the idle time with confidence"
        confidence = 0.4
    elif profile is None:
        headline = "no clear bottleneck: the serve metrics show no queueing or batching problem"
        confidence = 0.5
    else:
        headline = "no clear bottleneck: no rule fired with confidence on this CPU trace"
        confidence = 0.5
    levers = sorted({lever for f in findings for lever in f.levers}, key=lambda n: [
        f.levers.index(n) if n in f.levers else 99 for f in findings])
    return Diagnosis(bottleneck=NO_CLEAR_BOTTLENECK, confidence=confidence, headline=headline,
                     evidence={"gpu_busy_pct": round(busy, 1)} if busy is not None else {},
                     levers=levers, advice=[], **common)

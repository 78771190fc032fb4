"""Keep or reject a candidate: compare's decision against the current best, then the user's constraints.

A lever is kept only when `perflab.compare` accepts it (throughput significantly higher by more than the
minimum effect, and the quality gate passed) and it stays inside --max-p99-ms and --max-memory-gb.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Union

from perflab.compare import INCONCLUSIVE, NOT_JUDGED, compare_results
from perflab.results import Result
from perflab.results.quality import verdict_of
from perflab.results.records import Record

ACCEPT = "accept"


@dataclass
class Decision(Record):
    """One link of the chain: what was tried against what, what it measured, and whether it was kept."""

    kept: bool
    verdict: str  # compare's decision, or the trial's status when nothing was measured
    why: str
    gain_pct: Optional[float] = None
    ci95_pct: Optional[list[Optional[float]]] = None
    quality: Optional[str] = None
    reasons: list[str] = field(default_factory=list)
    noisy: list[str] = field(default_factory=list)  # why the timings are not clean (a busy machine, ...)
    noisy_sides: list[str] = field(default_factory=list)  # whose timings those are: "base" (the best), "candidate"
    judged: bool = True  # False: compare reached no verdict (noisy timings, an inconclusive quality gate)
    objective: str = "throughput"  # the figure judged: throughput (compare) or max-qps (perflab/tune/objective.py)
    against_value: Optional[float] = None  # max-qps: the best's max QPS, and the candidate's
    value: Optional[float] = None
    resolution_pct: Optional[float] = None  # max-qps: the search's resolution the gain had to beat


def peak_memory_gb(result: Result) -> Optional[float]:
    megabytes = result.peak_memory.mb
    return None if megabytes is None else megabytes / 1024


def constraint_violations(result: Result, max_p99_ms: Optional[float], max_memory_gb: Optional[float]) -> list[str]:
    """The constraints this result breaks, each as a sentence with its numbers."""
    broken = []
    p99 = result.metrics.latency_ms.p99 if result.metrics.latency_ms else None
    if max_p99_ms is not None and p99 is not None and p99 > max_p99_ms:
        broken.append(f"p99 step latency {p99:.2f} ms is over --max-p99-ms {max_p99_ms:g}")
    memory = peak_memory_gb(result)
    if max_memory_gb is not None and memory is not None and memory > max_memory_gb:
        broken.append(f"peak memory {memory:.2f} GB is over --max-memory-gb {max_memory_gb:g}")
    return broken


def judge(best: Result, candidate: Result, min_effect_pct: float, max_p99_ms: Optional[float] = None,
          max_memory_gb: Optional[float] = None, accept_noisy: bool = False) -> Decision:
    """compare_results(best, candidate) decides; a kept lever must also meet the constraints."""
    comparison = compare_results(best, candidate, min_effect_pct, accept_noisy=accept_noisy)
    throughput = comparison.metric("throughput")
    quality = verdict_of(candidate.quality)
    decision = Decision(kept=False, verdict=comparison.decision, why=comparison.reasons[0],
                        gain_pct=throughput.change_pct, ci95_pct=[throughput.ci_low_pct, throughput.ci_high_pct],
                        quality=quality, reasons=list(comparison.reasons), noisy=list(comparison.noisy),
                        noisy_sides=list(comparison.noisy_sides),
                        judged=comparison.decision not in (NOT_JUDGED, INCONCLUSIVE))
    if comparison.decision != ACCEPT:
        return decision
    broken = constraint_violations(candidate, max_p99_ms, max_memory_gb)
    if broken:
        decision.why = "faster, but " + "; ".join(broken)
        decision.reasons.append(decision.why)
        return decision
    decision.kept = True
    return decision


def unjudged_line(decisions: Iterable[Union[Decision, dict[str, Any], None]]) -> Optional[str]:
    """'2 of 3 trials not judged: <why the first was not>', or None when every measured trial was judged (a decision
    may come as recorded, a dict)."""
    read = [Decision.from_dict(d) if isinstance(d, dict) else d for d in decisions if d]
    measured = [d for d in read if d.verdict not in NOT_MEASURED]
    unjudged = [d for d in measured if not d.judged]
    if not unjudged:
        return None
    verdicts = ", ".join(dict.fromkeys(d.verdict or NOT_JUDGED for d in unjudged))
    return f"{len(unjudged)} of {len(measured)} trial(s) not judged ({verdicts}): {unjudged[0].why}"


NOT_MEASURED = ("refused", "oom", "error", "invalid", "timeout")


def not_measured(status: str, reason: str) -> Decision:
    """The decision for a trial that produced no result (refused, out of memory, crashed)."""
    words = {"refused": "refused by the run", "oom": "out of memory", "error": "the run failed",
             "invalid": "the run finished with unusable numbers",
             "timeout": "stopped at its time limit"}
    return Decision(kept=False, verdict=status, why=f"{words.get(status, status)}: {reason}")

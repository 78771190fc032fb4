"""What a workload's own generation loop costs per token beyond the model's step, from two runs of one model: the step
path (perflab's decode loop over the model's one-token step) and the loop path (the workload's own loop, e.g.
transformers' generate, timed whole: perflab/generation/loop_timing.py).

The loop path's time per output token holds the model's step and the loop's own work between steps (logits
processors, stopping criteria, cache bookkeeping, the Python that runs them); the step path's holds the step and
perflab's lean loop (a copy of the token and a clock mark). Their difference is the loop's own work per token: what
keeps the user's loop from the model's step speed. `perflab compare` of the two runs reports it, and so does
benchmarks/bench_generate_peers.py beside transformers' own timing of generate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from perflab.bottlenecks import LAUNCH_OVERHEAD
from perflab.diagnose.findings import Finding, clamp, rounded
from perflab.results.metrics import Generation

# Below this share of the step, the difference is within what two runs of the same thing differ by (the peers
# bench's agreement bound, benchmarks/bench_generate_peers.AGREE_PCT): no finding.
MEASURABLE_PCT = 3.0


@dataclass(frozen=True)
class LoopOverhead:
    """Time per output token through the workload's own loop and through the model's step alone."""

    step_ms_per_token: float
    loop_ms_per_token: float

    @property
    def ms_per_token(self) -> float:
        """The loop's own work per token."""
        return self.loop_ms_per_token - self.step_ms_per_token

    @property
    def pct_of_step(self) -> float:
        return 100 * self.ms_per_token / self.step_ms_per_token

    def summary(self) -> str:
        return (f"the workload's own loop takes {self.loop_ms_per_token:.3g} ms per token, the model's step "
                f"{self.step_ms_per_token:.3g} ms through perflab's decode loop: the loop's own work adds "
                f"{self.ms_per_token:.3g} ms per token ({self.pct_of_step:.1f}% of the step)")


def ms_per_token(generation: Generation) -> Optional[float]:
    """Time per output token after the first, over the whole run: the bandwidth bound's measured figure when there is
    one (the peers' tables' ms per step), else the mean TPOT."""
    bound = generation.bandwidth_bound
    if bound is not None and bound.measured_ms_per_token is not None:
        return bound.measured_ms_per_token
    return generation.tpot_ms.mean if generation.tpot_ms is not None else None


def loop_overhead(step: Generation, loop: Generation) -> Optional[LoopOverhead]:
    """The loop's own work per token, from a step-path run and a loop-path run of one model; None without both."""
    step_ms, loop_ms = ms_per_token(step), ms_per_token(loop)
    if not step_ms or loop_ms is None:
        return None
    return LoopOverhead(step_ms, loop_ms)


def loop_overhead_finding(step: Generation, loop: Generation) -> Optional[Finding]:
    """The finding: the loop's own work per token, when it is at least MEASURABLE_PCT of the step."""
    overhead = loop_overhead(step, loop)
    if overhead is None or overhead.pct_of_step < MEASURABLE_PCT:
        return None
    evidence = {"loop_ms_per_token": overhead.loop_ms_per_token, "step_ms_per_token": overhead.step_ms_per_token,
                "loop_overhead_ms_per_token": overhead.ms_per_token,
                "loop_overhead_pct_of_step": overhead.pct_of_step}
    return Finding(cls=LAUNCH_OVERHEAD, confidence=clamp(0.5 + overhead.pct_of_step / 50),
                   summary=f"{overhead.summary()}: that work, not the model, keeps the loop from the step's speed",
                   evidence=rounded(evidence), levers=[],
                   advice=["the loop's work runs on the host between the model's steps: `perflab profile` of the "
                           "loop-path run shows what it calls between them",
                           "transformers' generate runs every logits processor and stopping criterion once per token "
                           "(min_new_tokens, repetition penalties, ...): each one left out is work saved per token",
                           "a lean loop over the same compiled step (perflab's decode loop, gpt-fast's) runs at the "
                           "step path's speed"])


def loop_overhead_between(first: Optional[Generation], second: Optional[Generation]) -> Optional[Finding]:
    """The finding for two runs in either order, when one timed the step path and the other the loop path."""
    runs = {generation.timed_path: generation for generation in (first, second) if generation is not None}
    if set(runs) != {"step", "loop"}:
        return None
    return loop_overhead_finding(runs["step"], runs["loop"])

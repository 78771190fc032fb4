"""Phase shares: what a run's own phase timing says where no trace does.

Every `perflab run` times its phases (data wait, host-to-device copy, forward, backward, optimizer), so a result
holds the step's split even when its profile was cut or never taken (tune's profile is limited to a share of the
budget: 600 small tensors updated by Adam(foreach=False) launched 6,900 kernels a step, and the profile did not
finish). A phase outside the model's forward and backward that holds a large share of the step names its class's
levers: the optimizer step (one launch per tensor: the foreach and fused implementations first), the wait for data,
the host-to-device copy. With a trace the trace rules read the same causes with more evidence; this rule runs only on
a result alone (verdict.RESULT_RULES).
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import (H2D_COPIES, INPUT_PIPELINE, LAUNCH_OVERHEAD, NO_WORKERS, PAGEABLE_COPIES,
                                 SINGLE_TENSOR_UPDATES, WITH_WORKERS)
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for

# A phase holding this share of the step is named (the input-pipeline rule's threshold on the CPU is 10%; the
# optimizer's own step is part of every training step, so it needs more before it is a cause)
THRESHOLDS_PCT = {"data_wait": 10.0, "h2d": 10.0, "optimizer": 25.0}
# Phase timing places a cause without showing it (no kernels, no call stacks): these findings claim less than a
# trace rule with the same share would
BASE_CONFIDENCE = 0.3
MAX_CONFIDENCE = 0.75


def phase_shares(ctx: Context) -> Optional[Finding]:
    """The largest non-model phase of a result without a trace, with its class's levers; None below its threshold
    or with a trace (the trace rules read it then)."""
    if ctx.profile is not None or ctx.result is None:
        return None
    shares = ctx.metrics.phase_share_pct or {}
    named = [(share, phase) for phase, threshold in THRESHOLDS_PCT.items()
             if (share := shares.get(phase) or 0.0) >= threshold]
    if not named:
        return None
    share, phase = max(named)
    cls, levers, what = _cause(ctx, phase)
    evidence = {f"{phase}_share_pct": share, "phase_ms_per_step": (ctx.metrics.phases_ms or {}).get(phase),
                "source": "the run's phase timing (no trace)"}
    return Finding(
        cls=cls, confidence=clamp(BASE_CONFIDENCE + share / 100, high=MAX_CONFIDENCE),
        summary=f"{what} takes {share:.0f}% of the step by the run's phase timing; no trace shows why",
        evidence=rounded(evidence), levers=ctx.rank_levers(levers),
        advice=[f"profile the step to see what {what} runs (`perflab profile`, fewer --steps if it is long)"],
        expected_gain_pct=gain(share), gain_basis=f"{phase} share of the step")


def _cause(ctx: Context, phase: str) -> tuple[str, list[str], str]:
    """(class, levers, what the phase is) for a named phase."""
    if phase == "optimizer":
        # a long optimizer step is per-tensor launches far more often than arithmetic: its implementations, which
        # the phase places (compile and CUDA graphs act on the whole step, and tune screens them anyway)
        return (LAUNCH_OVERHEAD, levers_for(LAUNCH_OVERHEAD, {SINGLE_TENSOR_UPDATES}, always=False),
                "the optimizer step")
    if phase == "h2d":
        situations = set() if ctx.config("pin_memory") else {PAGEABLE_COPIES}
        return H2D_COPIES, levers_for(H2D_COPIES, situations), "the host-to-device copy"
    situations = {NO_WORKERS if ctx.config("workers", 0) == 0 else WITH_WORKERS}
    return INPUT_PIPELINE, levers_for(INPUT_PIPELINE, situations), "waiting for data"

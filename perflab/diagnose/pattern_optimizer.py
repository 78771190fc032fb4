"""Anti-patterns of the optimizer step: single-tensor update loops, gradients zeroed instead of set to None."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import LAUNCH_OVERHEAD, MEMORY_BANDWIDTH, SINGLE_TENSOR_UPDATES
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for
from perflab.diagnose.pattern_context import (MIN_SHARE_PCT, MINOR_MAX_CONFIDENCE, OPTIMIZER_MAX_CONFIDENCE,
                                              pattern_context)

OPTIMIZER_ELEMENTWISE = {"aten::add_", "aten::mul_", "aten::addcdiv_", "aten::addcmul_", "aten::lerp_",
                         "aten::sqrt", "aten::div", "aten::add", "aten::mul", "aten::neg", "aten::copy_"}


def single_tensor_optimizer(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None or not pc.optimizer_calls:
        return None
    names = [c.name for c in pc.optimizer_calls]
    if any(n.startswith(("aten::_foreach_", "aten::_fused_")) for n in names):
        return None
    loops = [c for c in pc.optimizer_calls if c.name in OPTIMIZER_ELEMENTWISE]
    per_step = len(loops) / ctx.profile.steps
    if per_step < 20:
        return None
    total_us = sum(c.device_us for c in loops)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    kernels_us = total_us
    evidence = {"op": loops[0].name, "module": "optimizer", "line": None, "elementwise_ops_per_step": per_step,
                "share_of_step_pct": share}
    return Finding(
        cls=LAUNCH_OVERHEAD, confidence=clamp(0.3 + share / 50, high=OPTIMIZER_MAX_CONFIDENCE),
        summary=f"the optimizer updates one tensor at a time: {per_step:.0f} elementwise ops per step, "
                f"{share:.0f}% of the step",
        evidence=rounded(evidence), levers=ctx.rank_levers(levers_for(LAUNCH_OVERHEAD, {SINGLE_TENSOR_UPDATES}, always=False)),
        advice=["build the optimizer with fused=True (or foreach=True): one kernel over all parameters"],
        expected_gain_pct=gain(pc.share_pct(0.8 * kernels_us)),
        gain_basis="80% of the per-tensor update ops' measured time (one fused kernel remains)")


def zeroed_grads(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None:
        return None
    zeroing = [c for c in pc.optimizer_calls if c.name in ("aten::zero_", "aten::fill_")]
    per_step = len(zeroing) / ctx.profile.steps
    if per_step < 4:
        return None
    share = pc.share_pct(sum(c.device_us for c in zeroing))
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.2 + share / 20, high=MINOR_MAX_CONFIDENCE),
        summary=f"gradients are zeroed, not set to None: {per_step:.0f} zero_ ops per step ({share:.1f}% of it), "
                "and backward then adds into them instead of writing them",
        evidence=rounded({"op": "aten::zero_", "module": "optimizer", "line": None, "zero_ops_per_step": per_step,
                          "share_of_step_pct": share}),
        levers=[], advice=["optimizer.zero_grad(set_to_none=True) (the default since torch 2.0)"],
        expected_gain_pct=gain(share), gain_basis="the zero_ ops' measured time")

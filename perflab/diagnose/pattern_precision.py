"""Anti-patterns of numeric precision: fp32 matmuls/convs with TF32 off, 16-bit matmuls with dims not a multiple
of 8."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from perflab.bottlenecks import COMPUTE_BOUND, FP32_MATMULS
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.roofline import ceilings
from perflab.levers import levers_for
from perflab.diagnose.pattern_context import (MIN_SHARE_PCT, MINOR_MAX_CONFIDENCE, REFINEMENT_MAX_CONFIDENCE, Match,
                                              SIXTEEN_BIT_DTYPES, PatternContext, pattern_context, place, where_of)

LINEAR_OPS = {"aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::einsum"}
SHAPED_LEAVES = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def _linear_calls(pc: PatternContext) -> list[tuple[OpCall, list[int]]]:
    """Forward matmul/conv calls with the shaped leaf ops (mm, addmm, bmm, conv) inside them."""
    ops = pc.trace.cpu_ops
    found = []
    for call in pc.forward:
        if call.name not in LINEAR_OPS:
            continue
        leaves = [int(i) for i in pc.subtree(call)
                  if ops.name(int(i)) in SHAPED_LEAVES or "convolution" in ops.name(int(i))]
        found.append((call, leaves))
    return found


def fp32_matmuls(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None:
        return None
    precision = ctx.config("precision")
    if precision not in (None, "fp32"):
        return None
    if ctx.on_gpu and precision is None and any("tf32" in n for n in ctx.trace.kernels.names):
        return None
    fp32 = [call for call, leaves in _linear_calls(pc)
            if leaves and all(pc.dtypes(i)[:1] == ["float"] for i in leaves)]
    if not fp32:
        return None
    matches = [Match([c]) for c in sorted(fp32, key=lambda c: -c.device_us)]
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    share = pc.share_pct(total_us)
    if share < 10.0:
        return None
    where = where_of(matches, ctx.profile.steps)
    speedup = _tf32_speedup(ctx) if ctx.on_gpu else 1.5
    evidence = {**where.evidence(), "fp32_matmul_share_of_step_pct": share, "expected_speedup_of_matmuls": speedup}
    # TF32 is a CUDA feature: on a CPU trace the finding is a note for the GPU run, not this run's verdict
    high = REFINEMENT_MAX_CONFIDENCE if ctx.on_gpu else MINOR_MAX_CONFIDENCE
    levers = ctx.rank_levers(levers_for(COMPUTE_BOUND, {FP32_MATMULS}, always=False))  # TF32 only on CUDA
    return Finding(
        cls=COMPUTE_BOUND, confidence=clamp(0.3 + share / 60, high=high),
        summary=f"fp32 matmuls/convs with TF32 off (most in {place(where)}) take {share:.0f}% of the step"
                + ("" if ctx.on_gpu else " (on CUDA, TF32 tensor cores; here, bf16)"),
        evidence=rounded(evidence), levers=levers,
        advice=["torch.backends.cuda.matmul.allow_tf32 = True (torch.set_float32_matmul_precision('high')), "
                "or bf16 autocast"],
        expected_gain_pct=gain(share * (1 - 1 / speedup)),
        gain_basis=f"the fp32 matmuls' measured time, {speedup:.1f}x faster at the calibrated TF32/bf16 peak")


def _tf32_speedup(ctx: Context) -> float:
    peaks = ceilings(ctx.trace).tflops
    fast, slow = peaks.get("tf32") or peaks.get("bf16"), peaks.get("fp32")
    # matmuls at their roof rarely reach the full ratio (memory-bound edges, epilogues): cap it
    return min(4.0, fast / slow) if fast and slow else 2.0


@dataclass
class OddDimsMatch(Match):
    """A 16-bit matmul whose dims are not a multiple of 8."""

    dims: list[int] = field(default_factory=list)


def odd_16bit_dims(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None:
        return None
    odd = []
    for call, leaves in _linear_calls(pc):
        bad = [i for i in leaves if pc.dtypes(i)[:1] and pc.dtypes(i)[0] in SIXTEEN_BIT_DTYPES and _odd_dims(pc, i)]
        if bad:
            odd.append((call, _odd_dims(pc, bad[0])))
    if not odd:
        return None
    matches = [OddDimsMatch([c], dims=d) for c, d in sorted(odd, key=lambda p: -p[0].device_us)]
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    where = where_of(matches, ctx.profile.steps)
    dims = matches[0].dims
    return Finding(
        cls=COMPUTE_BOUND, confidence=clamp(0.3 + share / 60, high=REFINEMENT_MAX_CONFIDENCE),
        summary=f"16-bit matmuls with dims not a multiple of 8 ({', '.join(map(str, dims))} in {place(where)}) "
                f"take {share:.0f}% of the step: tensor cores run them padded or not at all",
        evidence=rounded({**where.evidence(), "odd_dims": dims, "share_of_step_pct": share}), levers=[],
        advice=[f"pad the model's widths to multiples of 8 (e.g. {dims[0]} -> {-(-dims[0] // 8) * 8}); "
                "vocabulary sizes to multiples of 64"],
        expected_gain_pct=gain(0.3 * share), gain_basis="30% of those matmuls' measured time (aligned tiles)")


def _odd_dims(pc: PatternContext, index: int) -> list[int]:
    dims = pc.dims(index)
    sizes = [d for shape in dims[:3] if isinstance(shape, list) for d in shape[-2:] if isinstance(d, int)]
    return sorted({d for d in sizes if d > 8 and d % 8})

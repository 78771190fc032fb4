"""Compute bound: matmul/conv (tensor-core) kernels dominate a busy device."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import ATTENTION, COMPUTE_BOUND, CONVOLUTIONS, FULL_PRECISION
from perflab.config import is_full_precision
from perflab.diagnose.findings import CPU_MAX_CONFIDENCE, Context, Finding, clamp, dominance, gain, rounded
from perflab.levers import levers_for

BUSY_THRESHOLD_PCT = 50.0
SHARE_THRESHOLD_PCT = 50.0  # matmul/conv share of kernel time (GPU) or compute-phase time (CPU)
GOOD_ROOF_PCT = 70.0  # at this share of the roofline, "already good" is the honest answer


def compute_bound(ctx: Context) -> Optional[Finding]:
    if ctx.on_gpu:
        gpu = ctx.profile.gpu
        share = gpu.kernel_kind_pct.get("matmul/conv", 0.0)
        if gpu.busy_pct < BUSY_THRESHOLD_PCT or share < SHARE_THRESHOLD_PCT:
            return None
        evidence = {"gpu_busy_pct": gpu.busy_pct, "matmul_conv_kernel_time_pct": share}
        confidence = clamp(gpu.busy_pct / 100 * dominance(share))
        summary = f"the GPU is busy {gpu.busy_pct:.0f}% of the time, {share:.0f}% of it in matmul/conv kernels"
        matmul_ms = gpu.kernel_ms_per_step * share / 100
    else:
        share = ctx.profile.host.op_mix_pct.get("matmul/conv", 0.0)
        if share < SHARE_THRESHOLD_PCT:
            return None
        evidence = {"matmul_conv_op_time_pct": share}
        confidence = clamp(dominance(share), high=CPU_MAX_CONFIDENCE)
        summary = f"{share:.0f}% of compute time is matmul/conv ops"
        matmul_ms = ctx.profile.host.compute_phase_ms_per_step * share / 100
    advice = []
    expected, basis = ctx.step_pct(matmul_ms), "matmul/conv time per step (upper bound: no roofline placement)"
    rows = [row for row in ctx.profile.roofline if row.pct_of_roof is not None]
    if rows:
        best = rows[0]
        expected *= max(0.0, 1 - best.pct_of_roof / 100)
        basis = "matmul/conv time per step above the roofline of the heaviest op, at this precision"
        evidence.update(top_op=f"{best.op} {best.shapes}", top_op_achieved_tflops=best.achieved_tflops,
                        top_op_pct_of_roofline=best.pct_of_roof, ceiling_source=best.ceiling_source)
        if best.pct_of_roof >= GOOD_ROOF_PCT:
            advice.append(f"the heaviest op already reaches {best.pct_of_roof:.0f}% of its roofline: this is "
                          "already good; only lower precision or less work helps")
    mfu = ctx.metrics.flops.mfu_pct if ctx.metrics.flops else None
    if mfu is not None:
        evidence["mfu_pct"] = mfu
    situations = set()
    if is_full_precision(ctx.config("precision", "fp32")):
        situations.add(FULL_PRECISION)
    if any("conv" in name for name in ctx.trace.cpu_ops.names):
        situations.add(CONVOLUTIONS)
    if any("attention" in name or "fmha" in name for name in ctx.trace.kernels.names + ctx.trace.cpu_ops.names):
        situations.add(ATTENTION)
    levers = levers_for(COMPUTE_BOUND, situations)
    advice.append("better kernels: torch.compile(mode='max-autotune'), SDPA/flash attention where attention runs")
    return Finding(cls=COMPUTE_BOUND, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=levers, advice=advice, expected_gain_pct=gain(expected), gain_basis=basis)

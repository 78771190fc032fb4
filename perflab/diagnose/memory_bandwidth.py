"""Memory bandwidth: the busy time goes to low-intensity kernels (elementwise, reductions, copies)."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import CONVOLUTIONS, FULL_PRECISION, MEMORY_BANDWIDTH
from perflab.config import is_full_precision
from perflab.diagnose.findings import (CPU_MAX_CONFIDENCE, Context, Finding, by_expected_gain, clamp, dominance,
                                      gain, rounded)
from perflab.diagnose.patterns import chain_fusion_gain_pct
from perflab.levers import levers_for

BUSY_THRESHOLD_PCT = 50.0
SHARE_THRESHOLD_PCT = 50.0  # of kernel time (GPU) or compute-phase time (CPU)


def memory_bandwidth(ctx: Context) -> Optional[Finding]:
    if ctx.on_gpu:
        gpu = ctx.profile.gpu
        share = gpu.kernel_kind_pct.get("elementwise/reduction", 0.0)
        if gpu.busy_pct < BUSY_THRESHOLD_PCT or share < SHARE_THRESHOLD_PCT:
            return None
        top = [row.name[:60] for row in gpu.kernel_table if row.kind == "elementwise/reduction"][:3]
        evidence = {"gpu_busy_pct": gpu.busy_pct, "elementwise_reduction_kernel_time_pct": share,
                    "top_memory_bound_kernels": top}
        confidence = clamp(gpu.busy_pct / 100 * dominance(share))
        summary = (f"the GPU is busy {gpu.busy_pct:.0f}% of the time and {share:.0f}% of kernel time is elementwise/"
                   "reduction kernels (low arithmetic intensity: memory-bandwidth bound)")
        bound_ms = gpu.kernel_ms_per_step * share / 100
    else:
        share = ctx.profile.host.op_mix_pct.get("large elementwise/other ops", 0.0)
        if share < SHARE_THRESHOLD_PCT:
            return None
        evidence = {"large_elementwise_op_time_pct": share}
        confidence = clamp(dominance(share), high=CPU_MAX_CONFIDENCE)
        summary = f"{share:.0f}% of compute time is large elementwise/reduction ops (memory-bandwidth bound)"
        bound_ms = ctx.profile.host.compute_phase_ms_per_step * share / 100
    memory_bound_rows = [row for row in ctx.profile.roofline if row.bound == "memory"]
    if memory_bound_rows:
        evidence["memory_bound_matmul_conv_achieved_gbps"] = memory_bound_rows[0].achieved_gbps
    situations = set()
    if _has_convolutions(ctx):
        situations.add(CONVOLUTIONS)
    if is_full_precision(ctx.config("precision", "fp32")):
        situations.add(FULL_PRECISION)
    gains = lever_gains(ctx)
    evidence["expected_gain_by_lever_pct"] = gains
    levers = by_expected_gain(levers_for(MEMORY_BANDWIDTH, situations), gains)
    basis = ("what fusing the elementwise chains' forward passes saves" if gains else
             "elementwise/reduction time per step (upper bound: fusion removes part of it)")
    return Finding(cls=MEMORY_BANDWIDTH, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=levers,
                   advice=["fuse elementwise chains (torch.compile) so each tensor is read and written once",
                           "lower precision halves the bytes moved"],
                   expected_gain_pct=gain(max(gains.values()) if gains else ctx.step_pct(bound_ms)),
                   gain_basis=basis)


def lever_gains(ctx: Context) -> dict[str, float]:
    """The share of the step each lever should give back. Fusion is worth what the elementwise chains' forward passes
    cost (nothing is claimed without a chain). No figure for 16-bit: autocast runs elementwise ops in their inputs'
    dtype, so it halves the bytes only of what matmuls and convs feed (on the H100, bf16 gave +0% on a pure chain)."""
    fusion = chain_fusion_gain_pct(ctx)
    return {} if fusion is None else {"compile": fusion}


def _has_convolutions(ctx: Context) -> bool:
    ops = ctx.trace.cpu_ops
    return any("conv" in name for name in ops.names)

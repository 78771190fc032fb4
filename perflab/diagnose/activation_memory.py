"""Activation memory: the peak of device memory sits near capacity, so the next batch size would not fit."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import ACTIVATION_MEMORY, FULL_PRECISION
from perflab.diagnose.findings import Context, Finding, clamp, rounded
from perflab.levers import levers_for
from perflab.results.metrics import Memory

THRESHOLD_PCT = 90.0  # peak reserved memory as a share of the device's total


def activation_memory(ctx: Context) -> Optional[Finding]:
    memory = ctx.metrics.memory or Memory()
    peak_mb, total_mb = memory.peak_reserved_mb, memory.device_total_mb
    source = "result.json (torch.cuda.max_memory_reserved)"
    if not (peak_mb and total_mb) and ctx.trace.memory_peaks:
        peak_mb, total_mb = ctx.trace.memory_peaks.get("reserved_mb"), ctx.trace.gpu_total_mb
        source = "trace memory events (profile_memory)"
    if not (peak_mb and total_mb):
        return None
    used_pct = 100 * peak_mb / total_mb
    if used_pct < THRESHOLD_PCT:
        return None
    full_precision = ctx.config("precision", "fp32") in ("fp32", "tf32")
    levers = levers_for(ACTIVATION_MEMORY, {FULL_PRECISION} if full_precision else set())
    return Finding(
        cls=ACTIVATION_MEMORY, confidence=clamp(0.5 + (used_pct - THRESHOLD_PCT) / 20),
        summary=f"peak device memory {peak_mb:,.0f} MiB is {used_pct:.0f}% of {total_mb:,.0f} MiB: the next batch "
                "size will not fit",
        evidence=rounded({"peak_reserved_mb": float(peak_mb), "device_total_mb": float(total_mb),
                          "used_pct": used_pct, "source": source}),
        levers=levers, advice=["a smaller batch (with gradient accumulation to keep the effective one)"],
        expected_gain_pct=0.0, gain_basis="none in time: memory limits the batch size, not this step's speed")

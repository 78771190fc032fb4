"""Input pipeline: the step waits on the data loader, and the GPU idles meanwhile."""
from __future__ import annotations

from typing import Optional

from perflab.diagnose.findings import INPUT_PIPELINE, Context, Finding, clamp, rounded

THRESHOLD_PCT = 10.0  # GPU idle waiting for data (or, on the CPU, data-wait share of the step)


def input_pipeline(ctx: Context) -> Optional[Finding]:
    host = ctx.profile.host
    data_share = host.phase_share_pct.get("data")
    if data_share is None:
        data_share = ctx.metrics.get("phase_share_pct", {}).get("data_wait", 0.0)
    evidence = {"data_wait_ms_per_step": host.phase_ms_per_step.get("data", 0.0), "data_wait_share_pct": data_share,
                "workers": ctx.config("workers", "unknown")}
    signal = data_share
    if ctx.on_gpu:
        signal = ctx.profile.gpu.idle_split_pct["waiting for data"]
        evidence["gpu_idle_waiting_for_data_pct"] = signal
    if signal < THRESHOLD_PCT:
        return None
    workers = ctx.config("workers", 0)
    if workers == 0:
        levers = ["workers", "persistent-workers", "prefetch-factor"]
    else:
        levers = ["prefetch-factor", "persistent-workers", "workers"]
    levers += ["prefetcher-stream"]
    if ctx.config("augment") == "cpu":
        levers += ["augment-gpu", "augment-gpu-stream"]
    where = "the GPU sat idle waiting for data" if ctx.on_gpu else "the step waited for data"
    return Finding(
        cls=INPUT_PIPELINE, confidence=clamp(0.35 + signal / 60),
        summary=f"{where} {signal:.0f}% of the time ({evidence['data_wait_ms_per_step']:.2f} ms per step)",
        evidence=rounded(evidence), levers=ctx.rank_levers(levers),
        advice=["cache decoded/pre-processed items, or move per-item transforms to the GPU in batches",
                f"more DataLoader workers (this run: {workers})"])

"""Input pipeline: the step waits on the data loader, and the GPU idles meanwhile."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import CPU_AUGMENTATION, INPUT_PIPELINE, NO_WORKERS, WITH_WORKERS
from perflab.diagnose.copies import copy_bound
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for

THRESHOLD_PCT = 10.0  # GPU idle waiting for data (or, on the CPU, data-wait share of the step)
COPY_BOUND_PENALTY = 0.2  # confidence given up when pageable copies, not the loader, hold the step


def input_pipeline(ctx: Context) -> Optional[Finding]:
    host = ctx.profile.host
    data_share = host.phase_share_pct.get("data")
    if data_share is None:
        data_share = ctx.metrics.phase_share_pct.get("data_wait", 0.0)
    evidence = {"data_wait_ms_per_step": host.phase_ms_per_step.get("data", 0.0), "data_wait_share_pct": data_share,
                "workers": ctx.config("workers", "unknown")}
    signal, basis = data_share, "data-wait share of the step"
    if ctx.on_gpu:
        signal, basis = ctx.profile.gpu.idle_split_pct["waiting for data"], "GPU idle waiting for data"
        evidence["gpu_idle_waiting_for_data_pct"] = signal
    if signal < THRESHOLD_PCT:
        return None
    workers = ctx.config("workers", 0)
    situations = {NO_WORKERS if workers == 0 else WITH_WORKERS}
    if ctx.config("augment") == "cpu":
        situations.add(CPU_AUGMENTATION)
    levers = levers_for(INPUT_PIPELINE, situations)
    advice = ["cache decoded/pre-processed items, or move per-item transforms to the GPU in batches",
              f"more DataLoader workers (this run: {workers})"]
    syncs = ctx.profile.syncs
    if syncs.in_loader_per_step:
        # Host work the main process does per item (issue: .item() in CPU transforms read as device syncs).
        evidence["loader_host_ops_per_step"] = syncs.in_loader_by_op_per_step
        ops = ", ".join(f"{count:g} {op}" for op, count in syncs.in_loader_by_op_per_step.items())
        advice.append(f"the main process runs the per-item transforms inside the DataLoader ({ops} per step): "
                      "they run one after another with the step; workers take them off the main process")
    where = "the GPU sat idle waiting for data" if ctx.on_gpu else "the step waited for data"
    confidence = clamp(0.35 + signal / 60)
    if ctx.on_gpu and copy_bound(ctx):
        # the loader keeps up: pageable copies take longer than the data wait, so the copies come first
        confidence = clamp(confidence - COPY_BOUND_PENALTY)
        advice.insert(0, "the host-to-device copies take longer than the data wait: fix them first (pin-memory)")
    return Finding(
        cls=INPUT_PIPELINE, confidence=confidence,
        summary=f"{where} {signal:.0f}% of the time ({evidence['data_wait_ms_per_step']:.2f} ms per step)",
        evidence=rounded(evidence), levers=levers, advice=advice,
        expected_gain_pct=gain(signal), gain_basis=basis)

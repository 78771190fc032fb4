"""Host-to-device copies: the GPU waits on input copies (pageable memory, no overlap with compute).

Copies vs input: when the loader keeps up (little data wait) and pageable copies take the time, the copies are the
bottleneck, not the input pipeline (input_pipeline.py defers to this rule then). Each lever comes with the gain to
expect from the measured copy time: pinning (the copy at the calibrated pinned rate), compact dtypes (uint8 images
are a quarter of float32's bytes, converted on the GPU), and a stream prefetcher (the copy overlapped with compute).
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import H2D_COPIES, PAGEABLE_COPIES
from perflab.diagnose.findings import Context, Finding, by_expected_gain, clamp, gain, rounded
from perflab.diagnose.summary import MemcpyRow
from perflab.levers import levers_for

THRESHOLD_PCT = 10.0  # GPU idle (no kernel) while host-to-device copies are prepared or in flight
PINNED_OVER_PAGEABLE = 4.0  # pinned vs pageable H2D rate without a calibration (H100: 55 vs 9.7 GB/s)
FLOAT32_TO_UINT8 = 0.25
UINT8_INPUTS = "uint8 inputs"  # the code change: compact dtypes copied, converted on the GPU


def h2d_rows(ctx: Context) -> list[MemcpyRow]:
    gpu = ctx.profile.gpu
    return [row for row in gpu.memcpy_table if row.kind.startswith("H2D")] if gpu is not None else []


def copy_bound(ctx: Context) -> bool:
    """The loader keeps up and pageable copies take longer per step than the data wait: the copies lead."""
    rows = h2d_rows(ctx)
    pageable_ms = sum(row.ms_per_step for row in rows if "pageable" in row.kind)
    data_ms = ctx.profile.host.phase_ms_per_step.get("data", 0.0)
    return pageable_ms > 0 and pageable_ms >= data_ms


def host_to_device_copies(ctx: Context) -> Optional[Finding]:
    gpu = ctx.profile.gpu
    if gpu is None:
        return None
    rows = h2d_rows(ctx)
    idle = gpu.idle_split_pct["waiting on H2D copies"]
    if idle < THRESHOLD_PCT or not rows:
        return None
    copy_ms = sum(row.ms_per_step for row in rows)
    pageable_ms = sum(row.ms_per_step for row in rows if "pageable" in row.kind)
    overlap = sum(row.overlap_with_compute_pct * row.ms_per_step for row in rows) / copy_ms if copy_ms else 0.0
    megabytes = sum(row.mb_per_step for row in rows)
    measured_gbps = megabytes * 2**20 / (copy_ms * 1e6) if copy_ms else None
    gains = lever_gains(ctx, copy_ms, pageable_ms, measured_gbps)
    evidence = {"gpu_idle_waiting_on_h2d_pct": idle, "h2d_ms_per_step": copy_ms, "h2d_mb_per_step": megabytes,
                "h2d_gbps": measured_gbps, "pageable_share_pct": 100 * pageable_ms / copy_ms if copy_ms else 0.0,
                "overlap_with_compute_pct": overlap, "data_wait_ms_per_step":
                ctx.profile.host.phase_ms_per_step.get("data", 0.0), "expected_gain_by_lever_pct": gains}
    mostly_pageable = pageable_ms > 0.5 * copy_ms
    levers = by_expected_gain(levers_for(H2D_COPIES, {PAGEABLE_COPIES} if mostly_pageable else set()), gains)
    confidence = 0.35 + idle / 60 + (0.05 if mostly_pageable else 0.0)
    if copy_bound(ctx):
        confidence += 0.1  # the loader keeps up: nothing else explains the wait
    advice = [f"copy compact dtypes (uint8 images: a quarter of float32's bytes) and convert on the GPU: about "
              f"{gains[UINT8_INPUTS]:.0f}% of the step", "non_blocking copies from pinned memory "
              f"(DataLoader pin_memory=True pins in its own thread, off the step): about {gains['pin-memory']:.0f}%, "
              "since pinning copies the same bytes on the host"]
    best_lever = max((gains.get(name, 0.0) for name in levers), default=0.0)
    if gains[UINT8_INPUTS] <= best_lever:
        advice.reverse()
    return Finding(
        cls=H2D_COPIES, confidence=clamp(confidence),
        summary=f"the GPU waited on host-to-device copies {idle:.0f}% of the time ({megabytes:.0f} MB per step, "
                f"{evidence['pageable_share_pct']:.0f}% pageable at {measured_gbps or 0:.1f} GB/s, {overlap:.0f}% "
                "overlapped with compute)",
        evidence=rounded(evidence), levers=levers, advice=advice,
        expected_gain_pct=gain(min(idle, max(gains.values()))),
        gain_basis="the best copy lever's share of the step (GPU idle waiting on host-to-device copies caps it)")


def lever_gains(ctx: Context, copy_ms: float, pageable_ms: float, measured_gbps: Optional[float]) -> dict[str, float]:
    """The share of the step each copy lever should give back, from the measured copy time."""
    pinned_gbps = _calibrated_pinned_gbps(ctx)
    if measured_gbps and pinned_gbps:
        pin_saving = pageable_ms * max(0.0, 1 - measured_gbps / pinned_gbps)
    else:
        pin_saving = pageable_ms * (1 - 1 / PINNED_OVER_PAGEABLE)
    # Pinning is itself a host copy of the same bytes (DataLoader's pin thread, or the step's own thread without
    # workers), at about the rate the pageable path already copies at: the step cannot get shorter than that copy
    # on the pin thread, and without workers the copy lands in the step.
    pin_copy_ms = pageable_ms
    step_ms = ctx.profile.step_ms
    if ctx.config("workers", 0):
        pin_saving = min(pin_saving, max(0.0, step_ms - pin_copy_ms))
    else:
        pin_saving = max(0.0, pin_saving - pin_copy_ms)
    pinned_copy_ms = copy_ms - pin_saving
    compute_ms = sum(ctx.profile.host.phase_ms_per_step.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
    gpu_ms = ctx.profile.gpu.kernel_ms_per_step if ctx.profile.gpu else 0.0
    overlap_saving = min(pinned_copy_ms, max(compute_ms, gpu_ms))
    return {"pin-memory": ctx.step_pct(pin_saving),
            UINT8_INPUTS: ctx.step_pct(copy_ms * (1 - FLOAT32_TO_UINT8)),
            "prefetcher-stream": ctx.step_pct(min(pin_saving + overlap_saving, max(0.0, step_ms - pin_copy_ms)))}


def _calibrated_pinned_gbps(ctx: Context) -> Optional[float]:
    name = ctx.trace.gpu_name if ctx.trace is not None else None
    if not name:
        return None
    try:
        from perflab.calibrate import measured_ceilings_named  # imports torch: only when a GPU trace's copies are named
        for measured in measured_ceilings_named(name):
            if measured.h2d_pinned_gbps:
                return float(measured.h2d_pinned_gbps)
    except (OSError, ValueError):
        return None
    return None

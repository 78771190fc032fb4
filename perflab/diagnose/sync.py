"""Host-device sync: .item(), .cpu(), cudaStreamSynchronize inside the step drain the GPU's queue."""
from __future__ import annotations

from typing import Optional

from perflab.diagnose.findings import HOST_DEVICE_SYNC, Context, Finding, clamp, rounded

GPU_IDLE_THRESHOLD_PCT = 3.0  # GPU idle after the host blocked in a sync
CPU_CALLS_THRESHOLD = 2.0  # .item() calls per step outside the optimizer; one per layer is a structural sync
ADVICE = ["remove .item() / .cpu() / printing of tensors inside the step; keep running values on the device "
          "and read them once every N steps", "without syncs the step can also use cuda-graphs"]


def host_device_sync(ctx: Context) -> Optional[Finding]:
    if ctx.on_gpu:
        return _gpu(ctx)
    return _cpu(ctx)


def _gpu(ctx: Context) -> Optional[Finding]:
    gpu = ctx.profile.gpu
    calls = sum(gpu.sync_calls_per_step.values())
    idle = gpu.idle_split_pct["host-device syncs"]
    if calls + gpu.d2h_copies_per_step < 1 or idle < GPU_IDLE_THRESHOLD_PCT:
        return None
    evidence = {"gpu_idle_after_syncs_pct": idle, "sync_calls_per_step": calls,
                "d2h_copies_per_step": gpu.d2h_copies_per_step,
                "item_calls_per_step": ctx.profile.host.item_calls_per_step, **{
                    f"{name}_per_step": count for name, count in gpu.sync_calls_per_step.items()}}
    confidence = clamp(0.4 + idle / 30)
    advice = list(ADVICE)
    if ctx.config("sync_phases", False):
        confidence *= 0.3
        advice.insert(0, "this run used --sync-phases, which adds a sync at every phase boundary: re-profile without it")
    return Finding(
        cls=HOST_DEVICE_SYNC, confidence=confidence,
        summary=f"{calls + gpu.d2h_copies_per_step:.0f} host-device syncs per step left the GPU idle {idle:.0f}% "
                "of the time",
        evidence=rounded(evidence), levers=ctx.rank_levers([]), advice=advice)


def _cpu(ctx: Context) -> Optional[Finding]:
    calls = ctx.profile.host.item_calls_per_step
    if calls < CPU_CALLS_THRESHOLD:
        return None
    return Finding(
        cls=HOST_DEVICE_SYNC, confidence=clamp(0.5 + 0.04 * calls, high=0.9),
        summary=f"{calls:.0f} .item() calls per step inside the step; on a GPU each one waits for the queue to drain "
                "(cheap on this CPU run, costly on CUDA)",
        evidence=rounded({"item_calls_per_step": calls}), levers=[], advice=list(ADVICE))

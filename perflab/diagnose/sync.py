"""Host-device sync: .item(), .cpu(), nonzero, cudaStreamSynchronize inside the step drain the GPU's queue.

The primary finding when the GPU idle charged to syncs leads the idle split; a secondary one (never the verdict)
when a step still holds a sync inside forward/backward, or its idle is worth naming, but something else leads.
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import HOST_DEVICE_SYNC, LAUNCH_OVERHEAD, NO_HOST_SYNCS
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.sync_sites import EXPLICIT_SYNC, SyncProfile
from perflab.levers import levers_for

GPU_IDLE_THRESHOLD_PCT = 3.0  # GPU idle charged to syncs
CPU_CALLS_THRESHOLD = 2.0  # sync ops per step outside the optimizer; one per layer is a structural sync
SECONDARY_MAX_CONFIDENCE = 0.45
LOCKSTEP_SYNCS_PER_STEP = 2  # syncs per step in forward/backward from which the host is held in lockstep  # below the verdict's bar: named as "also", never as the bottleneck
ADVICE = ["keep running values on the device and read them once every N steps (no .item()/.cpu()/print of "
          "tensors inside the step)", "without syncs the step can also use cuda-graphs"]
# What removes the sync, by the op that caused it.
ADVICE_BY_OP = {
    "aten::item": ".item() / float(t) / if t: reads a value on the host; keep it on the device (torch.where, masks) "
                  "or read it every N steps",
    "aten::is_nonzero": "`if tensor:` reads the value on the host; keep the branch on the device (torch.where)",
    "aten::nonzero": "torch.nonzero / boolean indexing has a data-dependent size: route with fixed sizes "
                     "(masks, torch.topk, one-hot matmuls, nonzero_static(size=...))",
    "aten::masked_select": "masked_select has a data-dependent size: multiply by the mask instead",
    "aten::to": ".cpu() / .tolist() of a device tensor: accumulate statistics on the device and copy "
                "once every N steps (non_blocking into pinned memory)",
    "aten::repeat_interleave": "repeat_interleave with tensor repeats: pass output_size=",
    "aten::unique": "unique has a data-dependent size: bincount with minlength, or precompute",
    EXPLICIT_SYNC: "torch.cuda.synchronize() in the step: time with CUDA events instead",
}


def host_device_sync(ctx: Context) -> Optional[Finding]:
    if ctx.on_gpu:
        return _gpu(ctx)
    return _cpu(ctx)


def _gpu(ctx: Context) -> Optional[Finding]:
    gpu, syncs = ctx.profile.gpu, ctx.profile.syncs
    idle = gpu.idle_split_pct["host-device syncs"]
    if syncs.per_step == 0:
        return None
    other_causes = [pct for cause, pct in gpu.idle_split_pct.items() if cause not in ("host-device syncs", "other")]
    leads = idle >= GPU_IDLE_THRESHOLD_PCT and idle >= max(other_causes, default=0.0)
    # Syncs inside forward/backward also keep the host in lockstep with the GPU (it can never run ahead), and the
    # launch-overhead levers (CUDA graphs, compile without graph breaks) cannot capture a step that syncs. When
    # launching is what leaves the GPU idle in such a step, the syncs come first: removing them is what unlocks
    # the launch-overhead levers, so the gain to expect covers both.
    launch_idle = gpu.idle_split_pct.get("launch / framework overhead", 0.0)
    gates_launch = (syncs.in_model_per_step >= LOCKSTEP_SYNCS_PER_STEP and launch_idle >= GPU_IDLE_THRESHOLD_PCT
                    and launch_idle >= max(other_causes, default=0.0))
    expected = gain(idle + launch_idle) if gates_launch and not leads else gain(idle)
    if leads or gates_launch:
        confidence = clamp(0.5 + (idle + (launch_idle if gates_launch else 0.0)) / 30)
    elif syncs.in_model_per_step > 0 or idle >= GPU_IDLE_THRESHOLD_PCT:
        confidence = clamp(0.2 + idle / 60, high=SECONDARY_MAX_CONFIDENCE)
    else:
        return None
    evidence = {"gpu_idle_after_syncs_pct": idle, **_counts(syncs), "d2h_copies_per_step": gpu.d2h_copies_per_step,
                "item_calls_per_step": ctx.profile.host.item_calls_per_step}
    advice = _advice(syncs)
    if ctx.config("sync_phases", False):
        confidence *= 0.3
        advice.insert(0, "this run used --sync-phases, which adds a sync at every phase boundary: re-profile without it")
    summary = (f"{syncs.per_step:g} host-device syncs per step ({_top(syncs)}) left the GPU idle {idle:.0f}% "
               "of the time")
    basis = "GPU idle from each sync until the next kernel after it returned"
    if gates_launch and not leads:
        evidence["gpu_idle_launching_pct"] = launch_idle
        # once the step is free of syncs, the levers that need none take its launch idle: the first move is the pair
        evidence["then_levers"] = ctx.rank_levers(levers_for(LAUNCH_OVERHEAD, {NO_HOST_SYNCS}, always=False))
        summary += (f", and keep the host in lockstep with the GPU, which then idles {launch_idle:.0f}% more while "
                    "kernels are launched one by one; CUDA graphs and compile cannot capture a step that syncs: "
                    "remove the syncs first")
        basis = "GPU idle after the syncs plus the launch idle that the syncs keep the launch levers from removing"
        advice.append("then the launch-overhead levers apply: compile (fullgraph), cuda-graphs")
    elif not leads:
        summary += f"; {syncs.in_model_per_step:g} per step in forward/backward"
    return Finding(cls=HOST_DEVICE_SYNC, confidence=confidence, summary=summary, evidence=rounded(evidence), levers=[],
                   advice=advice, expected_gain_pct=expected, gain_basis=basis)


def _cpu(ctx: Context) -> Optional[Finding]:
    syncs = ctx.profile.syncs
    calls = syncs.per_step
    if calls < CPU_CALLS_THRESHOLD:
        return None
    evidence = {**_counts(syncs), "item_calls_per_step": ctx.profile.host.item_calls_per_step}
    return Finding(
        cls=HOST_DEVICE_SYNC, confidence=clamp(0.5 + 0.04 * calls, high=0.9),
        summary=f"{calls:g} calls per step of ops that sync on CUDA ({_top(syncs)}); on a GPU each one waits for "
                "the queue to drain (cheap on this CPU run, costly on CUDA)",
        evidence=rounded(evidence), levers=[], advice=_advice(syncs),
        expected_gain_pct=gain(ctx.step_pct(syncs.ms_per_step)),
        gain_basis="host time in those ops on this CPU run (on CUDA each also leaves the GPU idle)")


def _counts(syncs: SyncProfile) -> dict:
    counts = {"syncs_per_step": syncs.per_step, "syncs_by_op_per_step": syncs.by_op_per_step,
              "syncs_in_forward_backward_per_step": syncs.in_model_per_step}
    if syncs.by_call_per_step:
        counts["syncs_by_runtime_call_per_step"] = syncs.by_call_per_step
    if syncs.by_python_per_step:
        counts["syncs_by_python_per_step"] = dict(list(syncs.by_python_per_step.items())[:5])
    if syncs.by_module_per_step:
        counts["syncs_by_module_per_step"] = dict(list(syncs.by_module_per_step.items())[:5])
    return counts


def _top(syncs: SyncProfile, count: int = 3) -> str:
    """'12 aten::item, in model.py(20): forward' for the most frequent sources."""
    parts = [f"{n:g} {op}" for op, n in list(syncs.by_op_per_step.items())[:count]]
    frames = list(syncs.by_python_per_step) or [f"module {m}" for m in syncs.by_module_per_step]
    if frames:
        parts.append(f"{'in' if len(frames) == 1 else 'most in'} {frames[0]}")
    return ", ".join(parts)


def _advice(syncs: SyncProfile) -> list[str]:
    specific = [ADVICE_BY_OP[_family(op)] for op in syncs.by_op_per_step if _family(op) in ADVICE_BY_OP]
    return list(dict.fromkeys(specific + ADVICE))


def _family(op: str) -> str:
    """The op whose advice applies: .cpu() goes through to/_to_copy/copy_, .item() through _local_scalar_dense."""
    return {"aten::_to_copy": "aten::to", "aten::copy_": "aten::to", "aten::_local_scalar_dense": "aten::item",
            "aten::argwhere": "aten::nonzero", "aten::index": "aten::nonzero", "aten::_unique2": "aten::unique",
            "aten::_unique": "aten::unique", "aten::unique_consecutive": "aten::unique",
            "aten::unique_dim": "aten::unique"}.get(op, op)

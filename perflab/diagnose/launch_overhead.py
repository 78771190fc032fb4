"""Launch / framework overhead: many short kernels or ops; the device waits while the host dispatches."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import LAUNCH_OVERHEAD, NO_HOST_SYNCS, SINGLE_TENSOR_UPDATES, TRAINING
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.host_calls import MIN_STEP_PCT, HostCall, top_host_call
from perflab.diagnose.launch_sources import LaunchSources, launch_sources
from perflab.levers import levers_for

GPU_IDLE_THRESHOLD_PCT = 15.0  # GPU idle while the host launches (no data/copy/sync wait)
CPU_OVERHEAD_THRESHOLD_PCT = 50.0  # share of compute phases in small ops and Python between ops
CPU_OPS_PER_STEP = 100.0


def launch_overhead(ctx: Context) -> Optional[Finding]:
    syncs = ctx.profile.syncs.in_compute_per_step
    # A CUDA graph cannot capture a step that waits for the device, so graphs are not proposed while it syncs.
    situations = set() if syncs else {NO_HOST_SYNCS}
    if ctx.config("mode") == "train" or ctx.profile.host.phase_ms_per_step.get("optimizer"):
        situations.add(TRAINING)
    levers = levers_for(LAUNCH_OVERHEAD, situations)
    advice = ["a larger batch amortises the per-op cost"]
    if syncs:
        advice.append(f"CUDA graphs cannot capture this step: it syncs with the host {syncs:g} times per step "
                      "(see host-device sync); remove the syncs first")
    else:
        advice.append("torch.compile(mode='reduce-overhead') adds CUDA graphs")
    if ctx.on_gpu:
        gpu = ctx.profile.gpu
        idle = gpu.idle_split_pct["launch / framework overhead"]
        if idle < GPU_IDLE_THRESHOLD_PCT:
            return None
        evidence = {"gpu_idle_while_host_launches_pct": idle, "gpu_busy_pct": gpu.busy_pct,
                    "kernels_per_step": gpu.kernels_per_step, "median_kernel_us": gpu.median_kernel_us,
                    "short_kernel_count_pct": gpu.short_kernel_count_pct,
                    "launch_queue_median_us": gpu.launch_queue_median_us}
        confidence = clamp(0.3 + idle / 60 + 0.15 * gpu.short_kernel_count_pct / 100)
        summary = (f"the GPU idled {idle:.0f}% of the time while the host launched {gpu.kernels_per_step:.0f} kernels "
                   f"per step (median {gpu.median_kernel_us:.1f} µs, {gpu.short_kernel_count_pct:.0f}% under 10 µs)")
        expected, basis = idle, "GPU idle while the host launched work"
    else:
        host = ctx.profile.host
        overhead = host.op_mix_pct.get("small ops and framework overhead", 0.0)
        if overhead < CPU_OVERHEAD_THRESHOLD_PCT or host.ops_per_step < CPU_OPS_PER_STEP:
            return None
        evidence = {"small_ops_and_overhead_pct": overhead, "ops_per_step": host.ops_per_step,
                    "median_op_self_us": host.median_op_self_us}
        confidence = clamp(0.2 + 0.7 * overhead / 100)
        summary = (f"{overhead:.0f}% of compute time is small ops and framework overhead ({host.ops_per_step:.0f} ops "
                   f"per step, median {host.median_op_self_us or 0:.1f} µs each)")
        expected = ctx.step_pct(host.compute_phase_ms_per_step * overhead / 100)
        basis = "time per step in small ops and Python between ops (upper bound)"
    if syncs:
        evidence["syncs_in_step_per_step"] = syncs
    sources = launch_sources(ctx)
    if sources is not None:
        summary, levers, advice = _by_source(sources, summary, levers, advice)
        unit = sources.unit.replace(" ", "_")
        evidence[f"{unit}_by_phase_per_step"] = sources.by_phase
        evidence[f"{unit}_by_module_per_step"] = sources.by_module
    call = top_host_call(ctx.trace, ctx.profile.start_us, ctx.profile.end_us, ctx.profile.steps)
    if call is not None and ctx.step_pct(call.ms_per_step) >= MIN_STEP_PCT:
        summary, advice = _host_call_first(ctx, call, summary, advice, evidence)
    return Finding(cls=LAUNCH_OVERHEAD, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=levers, advice=advice, expected_gain_pct=gain(expected), gain_basis=basis)


def _host_call_first(ctx: Context, call: HostCall, summary: str, advice: list[str],
                     evidence: dict) -> tuple[str, list[str]]:
    """A host slow for one call of the user's code: the call is named first, its removal the first move (worth its
    host time: the launches behind it then keep up)."""
    share = ctx.step_pct(call.ms_per_step)
    move = f"code: {call.call}() out of the step"
    evidence.update({"host_call": call.call, "host_call_caller": call.caller, "host_call_ms_per_step": call.ms_per_step,
                     "host_call_step_pct": share, "expected_gain_by_lever_pct": {move: share}})
    first = (f"in {call.caller}: {call.call}() takes {share:.0f}% of the step on the host ({call.calls_per_step:g} "
             "calls a step): do it once, outside the step (a registered buffer, a tensor made on its device), or "
             "vectorise it; the launches it delays then keep ahead of the GPU")
    return f"{call.text(ctx.profile.step_ms)}; {summary}", [first, *advice]


def _by_source(sources: LaunchSources, summary: str, levers: list[str],
               advice: list[str]) -> tuple[str, list[str], list[str]]:
    """Say who launches, and put first the lever that removes the most launches: the optimizer's implementation
    when the optimizer launches more than forward and backward each, before graphs and compile."""
    text = sources.text()
    if text:
        summary = f"{summary}; {text}"
    if not sources.optimizer_dominates:
        return summary, levers, advice
    first = levers_for(LAUNCH_OVERHEAD, {SINGLE_TENSOR_UPDATES}, always=False)
    levers = first + [name for name in levers if name not in first]
    advice = [f"the optimizer launches {sources.share_pct('optimizer'):.0f}% of the step's {sources.unit} "
              f"({sources.phase_text('optimizer')}): build it with fused=True (or foreach=True) first, one kernel "
              "over all parameters (or one per group of tensors) instead of a dozen per tensor", *advice]
    return summary, levers, advice

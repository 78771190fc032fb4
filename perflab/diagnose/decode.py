"""Decode steps: launch-bound, memory-bandwidth-bound or compute-bound, judged against the bandwidth bound.

A decode step must read every weight and the KV cache once; that many bytes at the calibrated bandwidth is the
fastest the step can be (metrics.generation.bandwidth_bound). Near the bound (≥ 60% of it), the step is
bandwidth-bound: only reading fewer bytes (quantization) or producing more tokens per read (speculative decoding,
a larger batch) helps. Far above it with an eager step at a small batch, the GPU waits for the host to launch
kernels: launch-bound. When the batch is large enough that the matmuls at peak FLOP/s take longer than the
reads, the step is compute-bound. When the host needs about as long to issue a step as the device takes to run it
(host_issue_ms_per_token, from the host's clock at each token: nothing waits on the device per token), the host is
the limit even for a compiled step (Dynamo's guards, CUDA-graph bookkeeping, launches outside the graph). That
figure also rises when the device's launch queue is full (the host then waits for room; on the H100 it read
0.71-0.8 of a device-bound step), so it counts only when it fills 90% of the step. The device's own idle time
between steps (device_wait_ms_per_token: from each output to the next step's start, on the device's clock) is the
second signal: a device idle for a quarter of each step waits for the host's loop. A step that replays as one CUDA
graph and still sits below the bound is not launch-bound: its kernels read below the bandwidth (kernel efficiency).

With a profiled trace, `decode_layer_costs` says what keeps the step from the bound, per layer: the kernels that
read weights (matrix products, dequantising ones included), the kernels that read none (attention, norms, RoPE, the
KV write, activations: each small, each paying its own launch and ramp), standalone dequantisation (a quantized
weight widened in memory before its product), and the GPU's idle gaps between kernels (launches the device waits
for). The decode regime's finding carries these figures as evidence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from perflab.bottlenecks import (COMPUTE_BOUND, DECODE_BANDWIDTH_BOUND, DECODE_COMPUTE_BOUND, DECODE_KERNEL_EFFICIENCY,
                                 DECODE_LAUNCH_BOUND, LAUNCH_OVERHEAD, MEMORY_BANDWIDTH)
from perflab.config import RunConfig
from perflab.diagnose.findings import Context, Finding, clamp, rounded
from perflab.levers import levers_for
from perflab.results.metrics import BandwidthBoundSummary, DecodeCompile, Generation, Gpu
from perflab.diagnose.trace import ParsedTrace

NEAR_BOUND_PCT = 60.0  # at or above: bandwidth-bound
FAR_FROM_BOUND_PCT = 35.0  # below, eager and small batch: launch-bound
SMALL_BATCH = 8
HOST_BOUND_SHARE = 0.9  # issuing a step takes at least this share of the step: the device waits for the host
DEVICE_WAIT_SHARE = 0.25  # the device idles at least this share of a step between steps, waiting for the host


def decode_regime(ctx: Context) -> Optional[Finding]:
    """The diagnose rule: reads result.metrics.generation of a generation run."""
    generation = ctx.metrics.generation if ctx.result is not None else None
    if generation is None:
        return None
    busy = ctx.profile.gpu.busy_pct if ctx.on_gpu else None
    finding = classify_decode(generation, ctx.result.config, ctx.metrics.gpu, ctx.result.levers, busy)
    if finding is not None:
        finding.levers = ctx.rank_levers(finding.levers)
        costs = _traced_layer_costs(ctx, generation)
        if costs is not None:
            finding.evidence["per_layer_us"] = rounded(costs.per_layer_us())
            finding.advice.insert(0, costs.summary())
    return finding


def _traced_layer_costs(ctx: Context, generation: Generation) -> Optional["DecodeLayerCosts"]:
    """The per-layer costs of the profiled decode steps, when the run was profiled and says how many layers."""
    layers = ((ctx.result.workload or {}).get("info") or {}).get("layers") if ctx.result is not None else None
    if ctx.trace is None or not layers or not generation.output_len_mean:
        return None
    return traced_layer_costs(ctx.trace, generation, int(layers))


def traced_layer_costs(trace: ParsedTrace, generation: Generation, layers: int) -> Optional["DecodeLayerCosts"]:
    """The per-layer costs of a trace's decode steps, against the run's bound; None when it traced none."""
    kernels = decode_kernels(trace)
    steps = len(decode_ranges(trace)) * max(1, round(generation.output_len_mean or 0) - 1)
    if not kernels or not steps:
        return None
    bound = generation.bandwidth_bound
    return decode_layer_costs(kernels, steps, layers, bound.bound_ms_per_token if bound else None)


def classify_decode(generation: Generation, config: RunConfig, gpu: Optional[Gpu],
                    active: list[str] = (), gpu_busy_pct: Optional[float] = None) -> Optional[Finding]:
    """The decode regime of a generation run from its metrics, with the bound as evidence; None without a bound, and
    None for a loop timed whole (timed_path "loop"): its time per token mixes the model's step with the loop's own
    work, so the regime is judged on the step path, and the loop's share by generation_loop.loop_overhead."""
    if generation.timed_path == "loop":
        return None
    bound = generation.bandwidth_bound
    pct = bound.pct_of_bound if bound is not None else None
    if pct is None:
        return None
    batch = config.batch_size or 1
    compiled = bool(config.compile)
    evidence: dict[str, Any] = {
        "pct_of_bandwidth_bound": pct, "measured_ms_per_token": bound.measured_ms_per_token,
        "bound_ms_per_token": bound.bound_ms_per_token, "measured_over_bound": bound.measured_over_bound,
        "memory_gbps": bound.memory_gbps, "memory_gbps_source": bound.memory_gbps_source,
        "decode_batch": batch, "compiled_decode": compiled,
    }
    host_ms = bound.host_issue_ms_per_token
    if host_ms is not None:
        evidence["host_issue_ms_per_token"] = host_ms
    wait_ms = bound.device_wait_ms_per_token
    if wait_ms is not None:
        evidence["device_wait_ms_per_token"] = wait_ms
    if gpu is not None and gpu.util_mean_pct is not None:
        evidence["nvml_util_mean_pct"] = gpu.util_mean_pct
    if gpu_busy_pct is not None:
        evidence["gpu_busy_pct"] = gpu_busy_pct
    step = (f"a decode step takes {bound.measured_ms_per_token:.3g} ms per token, "
            f"{bound.measured_over_bound:.2g}x the {bound.bound_ms_per_token:.3g} ms it takes to read the "
            f"weights and KV cache once at {bound.memory_gbps:.0f} GB/s ({pct:.0f}% of the bound)")
    compute_ms = bound.compute_ms_per_token
    if compute_ms and compute_ms > bound.bound_ms_per_token:
        evidence["compute_ms_per_token_at_peak"] = compute_ms
        return _finding(COMPUTE_BOUND, clamp(0.5 + 0.4 * min(1.0, compute_ms / bound.measured_ms_per_token)),
                        f"{step}; at batch {batch} the matmuls need {compute_ms:.3g} ms at peak FLOP/s, more "
                        "than the reads: compute-bound", evidence,
                        _regime_levers(COMPUTE_BOUND, DECODE_COMPUTE_BOUND), active,
                        ["a smaller decode batch lowers latency; a larger one only adds throughput now"])
    host_wait = _host_wait(bound) if compiled and config.device == "cuda" and pct < NEAR_BOUND_PCT else None
    if host_wait is not None:
        waited_ms, waited = host_wait
        return _finding(LAUNCH_OVERHEAD, clamp(0.5 + waited_ms / bound.measured_ms_per_token / 4),
                        f"{step}; {waited}: host-bound", evidence,
                        [], active,
                        ["with --option decode_graphs=inductor, check generation.decode_compile.cudagraph_skips "
                         "(0: the step replays as one CUDA graph); perflab's own capture (the default) runs the "
                         "guards once",
                         "per-call host cost grows with the number of guarded weights (tensor-subclass weights "
                         "cost most): TORCH_LOGS=guards lists them"])
    if pct >= NEAR_BOUND_PCT:
        return _finding(MEMORY_BANDWIDTH, clamp(0.5 + (pct - NEAR_BOUND_PCT) / 80), f"{step}: bandwidth-bound",
                        evidence, _regime_levers(MEMORY_BANDWIDTH, DECODE_BANDWIDTH_BOUND), active,
                        ["read fewer bytes per token (quantized weights) or make more tokens per read "
                         "(speculative decoding, a larger decode batch)"])
    if _replays_as_one_graph(generation):
        achieved = bound.achieved_gbps
        reads = f" (its reads run at {achieved:.0f} GB/s)" if achieved else ""
        return _finding(MEMORY_BANDWIDTH, clamp(0.5 + (NEAR_BOUND_PCT - pct) / 200),
                        f"{step}: the step replays as one CUDA graph, so launching is not the cost; its kernels "
                        f"read below the bandwidth{reads}: kernel efficiency", evidence,
                        _regime_levers(MEMORY_BANDWIDTH, DECODE_KERNEL_EFFICIENCY), active,
                        ["`perflab profile` of the same run lists the decode step's kernels: small ones (norms, "
                         "rotary embeddings, one-query attention) each run far below the bandwidth",
                         "--compile max-autotune tunes the matrix-vector kernels further (minutes of compiling)"])
    eager_small = not compiled and batch <= SMALL_BATCH
    confidence = clamp(0.4 + (NEAR_BOUND_PCT - pct) / 100 + (0.2 if eager_small else 0.0))
    if pct < FAR_FROM_BOUND_PCT or eager_small:
        return _finding(LAUNCH_OVERHEAD, confidence,
                        f"{step}: {_waiting(config)} (launch-bound)", evidence,
                        _regime_levers(LAUNCH_OVERHEAD, DECODE_LAUNCH_BOUND), active,
                        ["--kv-cache static --compile reduce-overhead captures the decode step as CUDA graphs",
                         "a larger decode batch reads the same weights for more tokens"])
    return _finding(MEMORY_BANDWIDTH, 0.4, f"{step}: between launch-bound and bandwidth-bound", evidence,
                    _between_levers(), active, [])


def _regime_levers(cls: str, regime: str) -> list[str]:
    """The levers that declare they answer this decode regime (perflab/levers), best first."""
    return levers_for(cls, {regime}, always=False)


def _between_levers() -> list[str]:
    """Between launch-bound and bandwidth-bound: the launch-bound levers, then the first bandwidth-bound one."""
    return (_regime_levers(LAUNCH_OVERHEAD, DECODE_LAUNCH_BOUND)
            + _regime_levers(MEMORY_BANDWIDTH, DECODE_BANDWIDTH_BOUND)[:1])


def _host_wait(bound: BandwidthBoundSummary) -> Optional[tuple[float, str]]:
    """How long each step waits for the host, and in which words; None when the host keeps up. The device idling
    between steps (device_wait_ms_per_token: what the loop does between steps) comes first; else the host's own
    issue time filling the step (what happens inside the step's call, e.g. Dynamo's guards, which the device's
    clock sees as part of the step)."""
    step_ms = bound.measured_ms_per_token
    wait_ms, host_ms = bound.device_wait_ms_per_token, bound.host_issue_ms_per_token
    if wait_ms is not None and wait_ms >= DEVICE_WAIT_SHARE * step_ms:
        return wait_ms, f"the device waits {wait_ms:.3g} ms per token for the host to issue the next step"
    if host_ms is not None and host_ms >= HOST_BOUND_SHARE * step_ms:
        return host_ms, f"the host needs {host_ms:.3g} ms to issue each step"
    return None


def _replays_as_one_graph(generation: Generation) -> bool:
    """The compiled decode step ran as CUDA graphs: captured by perflab, or by Inductor with no skipped graph."""
    compiled = generation.decode_compile or DecodeCompile()
    return (compiled.graphs == "perflab" and bool(compiled.captured_lengths)) or (
        compiled.graphs == "inductor" and compiled.cudagraph_skips == 0)


def _waiting(config: RunConfig) -> str:
    if config.device == "cuda":
        return "the GPU waits for the host to launch each small kernel"
    return "the per-op cost of the framework dominates ops this small"


def _finding(cls: str, confidence: float, summary: str, evidence: dict[str, Any], levers: list[str],
             active, advice: list[str]) -> Finding:
    return Finding(cls=cls, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=[name for name in levers if name not in set(active)], advice=advice)


# ---------------------------------------------------------------------------------------------- per layer, traced

# Kernels that multiply by weight matrices: cuBLAS/cuBLASLt (gemm, gemv, nvjet, xmma, cutlass), Inductor's generated
# products (names holding "mm" with unique kernel names), torchao's int4 (tinygemm, int4pack), fp8 scaled products.
WEIGHT_KERNEL = re.compile(r"gemm|gemv|nvjet|xmma|cutlass|tinygemm|int4pack|_mm_|_mm$|_mm\b|mm_kernel|splitk|"
                           r"scaled_mm|matmul", re.IGNORECASE)
# Attention kernels read the KV cache, not weights (cuDNN's and the memory-efficient kernel's names hold "cutlass").
ATTENTION_KERNEL = re.compile(r"fmha|flash|attention|attn|sdpa|cudnn", re.IGNORECASE)
# Kernels that only widen quantized weights (int8/fp8/int4 to bf16) in memory, before a separate product: named so,
# Inductor's pointwise kernels of a conversion (and scale) alone, eager's dtype-converting copies. A fused kernel that
# converts inside other work (a norm's upcast: triton_per_fused__to_copy_add_mean_...) is not one.
DEQUANT_KERNEL = re.compile(r"dequant|unpack|^triton_poi_fused__to_copy(_mul)?_\d+$|direct_copy_kernel",
                            re.IGNORECASE)
TOP_OTHERS = 4


@dataclass(frozen=True)
class KernelSpan:
    """One kernel of a decode step, as the trace recorded it (µs)."""

    name: str
    start_us: float
    dur_us: float
    request: int = 0  # which decode phase (host "decode" range) launched it: gaps are counted within one


@dataclass
class DecodeLayerCosts:
    """Where a decode step's time goes, per step and per layer (µs), against the bandwidth bound."""

    steps: int
    layers: int
    step_us: float  # first kernel start to last kernel end of each decode phase, per step
    weight_us: float  # kernels that multiply by weights, per step
    dequant_us: float  # standalone dequantisation kernels, per step
    other_us: float  # kernels that read no weights, per step
    gap_us: float  # the GPU idle between kernels, per step
    bound_us: Optional[float] = None
    top_others: list[tuple[str, float]] = field(default_factory=list)  # (kernel, µs per layer), largest first

    def per_layer_us(self) -> dict[str, Any]:
        per = lambda us: us / self.layers  # noqa: E731
        return {"weight_kernels": per(self.weight_us), "non_weight_kernels": per(self.other_us),
                "dequantisation": per(self.dequant_us), "launch_gaps": per(self.gap_us),
                "step": per(self.step_us), "bound": per(self.bound_us) if self.bound_us else None,
                "top_non_weight": {name: us for name, us in self.top_others}}

    def largest_cost(self) -> tuple[str, float]:
        """The biggest cost that is not reading weights: (what, µs per step)."""
        costs = {"kernels that read no weights": self.other_us, "launch gaps": self.gap_us,
                 "dequantisation": self.dequant_us}
        return max(costs.items(), key=lambda item: item[1])

    def summary(self) -> str:
        """One sentence with the per-layer figures, the largest cost named first."""
        what, us = self.largest_cost()
        per = self.per_layer_us()
        bound = f" ({100 * us / self.bound_us:.0f}% of the {self.bound_us / 1e3:.3g} ms bound)" if self.bound_us else ""
        top = ", ".join(f"{name[:40]} {value:.1f}" for name, value in self.top_others[:3])
        return (f"per layer, {self.steps} traced decode steps: weight products {per['weight_kernels']:.1f} µs, "
                f"kernels that read no weights {per['non_weight_kernels']:.1f} µs ({top}), dequantisation "
                f"{per['dequantisation']:.1f} µs, launch gaps {per['launch_gaps']:.1f} µs; the largest cost off the "
                f"bound is {what}: {us / 1e3:.3g} ms per step over {self.layers} layers{bound}")


def decode_layer_costs(kernels: Sequence[KernelSpan], steps: int, layers: int,
                       bound_ms_per_step: Optional[float] = None) -> DecodeLayerCosts:
    """Split the kernels of `steps` decode steps of a `layers`-layer model into weight products, dequantisation,
    everything else, and the idle gaps between them; per step, with the bound per step for scale."""
    ordered = sorted(kernels, key=lambda k: k.start_us)
    weight = dequant = other = 0.0
    others: dict[str, float] = {}
    for kernel in ordered:
        if WEIGHT_KERNEL.search(kernel.name) and not ATTENTION_KERNEL.search(kernel.name):
            weight += kernel.dur_us
        elif DEQUANT_KERNEL.search(kernel.name):
            dequant += kernel.dur_us
        else:
            other += kernel.dur_us
            others[kernel.name] = others.get(kernel.name, 0.0) + kernel.dur_us
    gaps = span = 0.0
    for request in sorted({k.request for k in ordered}):  # a prefill between two decode phases is no gap
        phase = [k for k in ordered if k.request == request]
        starts = np.array([k.start_us for k in phase])
        ends = np.maximum.accumulate(np.array([k.start_us + k.dur_us for k in phase]))
        gaps += float(np.clip(starts[1:] - ends[:-1], 0.0, None).sum())
        span += float(ends[-1] - starts[0])
    top = sorted(others.items(), key=lambda item: -item[1])[:TOP_OTHERS]
    return DecodeLayerCosts(steps, layers, span / steps, weight / steps, dequant / steps, other / steps, gaps / steps,
                            bound_ms_per_step * 1e3 if bound_ms_per_step else None,
                            [(name, us / steps / layers) for name, us in top])


def decode_kernels(trace: ParsedTrace) -> list[KernelSpan]:
    """The GPU kernels launched inside the host's "decode" ranges (by their launches' correlation ids; a CUDA graph's
    kernels follow its one graph launch)."""
    ranges = decode_ranges(trace)
    if not ranges or not len(trace.kernels):
        return []
    launches = trace.runtime
    request_of: dict[int, int] = {}
    for request, (begin, finish) in enumerate(ranges):
        inside = (launches.start_us >= begin) & (launches.start_us <= finish) & (launches.correlation >= 0)
        request_of.update(dict.fromkeys(launches.correlation[inside].tolist(), request))
    kernels = trace.kernels
    return [KernelSpan(kernels.name(i), float(kernels.start_us[i]), float(kernels.dur_us[i]),
                       request_of[int(kernels.correlation[i])])
            for i in range(len(kernels)) if int(kernels.correlation[i]) in request_of]


def decode_ranges(trace: ParsedTrace) -> list[tuple[float, float]]:
    """(start, end) µs of each request's decode phase: the host's outermost "decode" ranges (a range nested in another
    of the same name, NVTX and record_function both, is one phase)."""
    annotations = trace.annotations
    decode = annotations.mask(lambda name: name == "decode")
    outermost: list[tuple[float, float]] = []
    for begin, finish in sorted(zip(annotations.start_us[decode].tolist(), annotations.end_us[decode].tolist())):
        if outermost and begin < outermost[-1][1]:
            continue
        outermost.append((begin, finish))
    return outermost

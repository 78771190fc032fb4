"""The numbers every rule reads, computed once from a parsed trace: the step window, GPU busy/idle and
its split, the kernel and copy tables, host phases, the CPU op mix and the host-device syncs."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.diagnose.intervals import Intervals, intervals_of
from perflab.results.records import Record
from perflab.diagnose.phases import COMPUTE_PHASES, PHASES, loader_intervals, phase_intervals
from perflab.diagnose.runtime_calls import RuntimeApiProfile, runtime_calls
from perflab.diagnose.sync_sites import SyncProfile, SyncSite, find_sync_sites, sync_profile, sync_shadow
from perflab.diagnose.communication import communication_host, is_nccl_kernel
from perflab.diagnose.trace import EventTable, ParsedTrace, step_window
from perflab.diagnose.roofline import RooflineRow, roofline_rows

SHORT_KERNEL_US = 10.0
LARGE_CPU_OP_US = 20.0
LOCKSTEP_HOST_FRACTION = 0.8  # GPU work >= this x the host's unblocked time: the host would run ahead without syncs
IDLE_CAUSES = ("waiting for data", "waiting on H2D copies", "host-device syncs", "allocator and blocking calls",
               "waiting on communication", "launch / framework overhead", "other")

_COMPUTE_KERNEL = re.compile(r"gemm|cutlass|wgmma|xmma|\bmma|conv(?!ert)|winograd|implicit|flash|fmha|attention|"
                             r"triton_tem|triton_mm|dot_kernel|cublas", re.IGNORECASE)
_MEMORY_KERNEL = re.compile(r"elementwise|reduce|norm|softmax|copy|cat|transpose|nchwToNhwc|nhwcToNchw|bn_|pool|"
                            r"index|scatter|gather|fill|triton_poi|triton_red|triton_per|adam|sgd|foreach|"
                            r"upsample|embedding|dropout|relu|gelu|silu|sigmoid|tanh", re.IGNORECASE)
_COMPUTE_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::addmv", "aten::mv",
                "aten::dot", "aten::mkldnn_convolution", "aten::convolution_backward", "aten::_convolution",
                "aten::convolution", "aten::cudnn_convolution", "aten::_scaled_dot_product_flash_attention",
                "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_attention_math",
                "aten::_flash_attention_forward", "aten::mkldnn_linear", "aten::_mkldnn_convolution",
                "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward", "aten::slow_conv_dilated2d"}


def kernel_kind(name: str) -> str:
    """matmul/conv, elementwise/reduction, communication or other, from the kernel's name."""
    if is_nccl_kernel(name):
        return "communication"
    if _COMPUTE_KERNEL.search(name) and not re.search(r"bn_|nchwToNhwc|nhwcToNchw", name):
        return "matmul/conv"
    if _MEMORY_KERNEL.search(name):
        return "elementwise/reduction"
    return "other"


def memcpy_kind(name: str) -> str:
    """'H2D pageable', 'H2D pinned', 'D2H pageable', 'D2D', ... from a kineto memcpy name."""
    direction = next((d for d in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP") if d in name), "?")
    label = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "HtoH": "H2H", "PtoP": "P2P"}.get(direction, "copy")
    if "Pageable" in name:
        return f"{label} pageable"
    if "Pinned" in name:
        return f"{label} pinned"
    return label


@dataclass
class KernelRow(Record):
    """One kernel name's time in the profiled steps."""

    name: str
    kind: str  # kernel_kind
    count_per_step: float
    ms_per_step: float
    mean_us: float
    share_pct: float  # of all kernel time


@dataclass
class MemcpyRow(Record):
    """One kind of memory copy (memcpy_kind) in the profiled steps."""

    kind: str
    count_per_step: float
    ms_per_step: float
    mb_per_step: float
    gbps: Optional[float]
    overlap_with_compute_pct: float


@dataclass
class HostOpRow(Record):
    """One CPU op's self time in the compute phases."""

    name: str
    calls_per_step: float
    self_ms_per_step: float
    mean_self_us: float
    share_pct: float  # of the compute phases' time


@dataclass
class GpuProfile(Record):
    busy_pct: float  # share of the window with at least one kernel running
    copy_only_pct: float  # copies running, no kernel
    idle_pct: float  # neither kernels nor copies
    idle_split_pct: dict[str, float]  # share of the window with no kernel, by cause (IDLE_CAUSES)
    kernels_per_step: float
    kernel_ms_per_step: float
    short_kernel_count_pct: float  # kernels under SHORT_KERNEL_US
    short_kernel_time_pct: float
    median_kernel_us: float
    kernel_kind_pct: dict[str, float]  # share of kernel time by kind
    kernel_table: list[KernelRow]
    memcpy_table: list[MemcpyRow]
    launch_queue_median_us: Optional[float]  # launch call end -> kernel start; small means the GPU waits on the host
    sync_calls_per_step: dict[str, float]  # blocking runtime calls in the step, outside the DataLoader
    d2h_copies_per_step: float


@dataclass
class HostProfile(Record):
    phase_ms_per_step: dict[str, float]
    phase_share_pct: dict[str, float]
    ops_per_step: float
    item_calls_per_step: float  # aten::item outside the optimizer phase and the DataLoader
    compute_phase_ms_per_step: float
    op_mix_pct: dict[str, float]  # share of compute-phase time: matmul/conv, large elementwise, small ops and overhead
    median_op_self_us: Optional[float]
    op_table: list[HostOpRow]


@dataclass
class TraceProfile(Record):
    device: str  # "cuda" when the trace holds GPU activity, else "cpu"
    steps: int
    window_ms: float
    step_ms: float
    host: HostProfile
    syncs: SyncProfile
    gpu: Optional[GpuProfile] = None
    roofline: list[RooflineRow] = field(default_factory=list)
    gpu_name: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    start_us: float = 0.0  # the analysed window on the trace's clock (the operator view and the rules share it)
    end_us: float = 0.0
    gpu_start_us: float = 0.0  # where the GPU's busy/idle split starts: start_us, or a later first kernel (notes)
    runtime_api: Optional[RuntimeApiProfile] = None  # GPU traces: the blocking runtime calls (runtime_calls.py)


def summarize(trace: ParsedTrace, precision: Optional[str] = None) -> TraceProfile:
    """All shared numbers for the rules, from one pass over the parsed trace."""
    start, end, steps = step_window(trace)
    notes = []
    gpu_start = start
    if trace.has_gpu:
        gpu_start, end = _gpu_window(trace, start, end, notes)
    window_us = max(end - start, 1e-9)
    steps = max(steps, 1)
    host = _host_profile(trace, start, end, steps, window_us)
    sites = find_sync_sites(trace, start, end)
    syncs = sync_profile(sites, steps, trace.has_gpu)
    for framework, per_step in syncs.framework_per_step.items():
        notes.append(f"{per_step:g} host-device syncs per step are {framework}: not counted as the step's syncs "
                     "(a longer run leaves them behind)")
    calls = runtime_calls(trace, start, gpu_start, end, steps)
    gpu = (_gpu_profile(trace, gpu_start, end, steps, max(end - gpu_start, 1e-9), sites, syncs,
                        calls.blocking_sites if calls is not None else [])
           if trace.has_gpu else None)
    return TraceProfile(device="cuda" if trace.has_gpu else "cpu", steps=steps, window_ms=window_us / 1e3,
                        step_ms=window_us / 1e3 / steps, host=host, syncs=syncs, gpu=gpu,
                        roofline=roofline_rows(trace, precision=precision), gpu_name=trace.gpu_name, notes=notes,
                        start_us=start, end_us=end, gpu_start_us=gpu_start,
                        runtime_api=calls.profile if calls is not None else None)


def _gpu_window(trace: ParsedTrace, start: float, end: float, notes: list[str]) -> tuple[float, float]:
    """(start, end) of the GPU's busy/idle split: the step window extended to the last GPU activity, started at the
    first kernel if the GPU was still busy with work launched before the capture (a long launch queue), whose
    start the trace does not show. The host's figures keep the step window: its steps may all lie before that."""
    gpu_end = max(float(t.end_us.max()) for t in (trace.kernels, trace.memcpys) if len(t))
    end = max(end, gpu_end)
    if len(trace.kernels):
        # how long the first kernel launched inside the capture waited in the queue: kernels launched before the
        # capture have no launch call in the trace (their wait is NaN), so the first kernel is the wrong one to ask
        queue = _launch_queue_us(trace)
        launched = np.flatnonzero(np.isfinite(queue)) if queue is not None else np.empty(0, dtype=np.int64)
        first = float(trace.kernels.start_us[0])
        if len(launched) and queue[launched[0]] > 50.0 and first > start:
            notes.append("the GPU was still running work launched before the capture; its busy/idle split starts "
                         "at the first recorded kernel")
            start = first
    return start, end


def _launch_queue_us(trace: ParsedTrace) -> Optional[np.ndarray]:
    """Per kernel (in start order), time from the end of its launch call to its start; None without links."""
    rt, k = trace.runtime, trace.kernels
    if not len(rt) or not len(k) or (k.correlation < 0).all():
        return None
    order = np.argsort(rt.correlation)
    sorted_corr = rt.correlation[order]
    pos = np.clip(np.searchsorted(sorted_corr, k.correlation), 0, len(sorted_corr) - 1)
    found = sorted_corr[pos] == k.correlation
    launch_end = rt.end_us[order][pos]
    return np.where(found, k.start_us - launch_end, np.nan)


def _host_profile(trace: ParsedTrace, start: float, end: float, steps: int, window_us: float) -> HostProfile:
    ann = trace.annotations
    in_window = (ann.start_us >= start) & (ann.start_us < end)
    phase_ms = {}
    for name in PHASES:
        selected = in_window & ann.mask(lambda n, name=name: n == name)
        if selected.any():
            phase_ms[name] = float(ann.dur_us[selected].sum()) / 1e3 / steps
    step_ms = window_us / 1e3 / steps
    compute = phase_intervals(trace, COMPUTE_PHASES).clip(start, end)
    ops = trace.cpu_ops
    op_in_window = (ops.start_us >= start) & (ops.start_us < end)
    items = op_in_window & ops.mask(lambda n: n == "aten::item")
    optimizer = phase_intervals(trace, ("optimizer",))
    items &= ~optimizer.contains(ops.start_us)  # optimizers read CPU step counters with .item(): no device sync
    items &= ~loader_intervals(trace).contains(ops.start_us)  # the loader's own work is the input pipeline's
    self_us = _self_times(ops)
    in_compute = op_in_window & compute.contains(ops.start_us)
    compute_us = compute.total if len(compute) else 0.0
    op_mix, op_table, median_self = {}, [], None
    if in_compute.any() and compute_us > 0:
        is_compute_op = ops.mask(lambda n: n in _COMPUTE_OPS)
        large = self_us >= LARGE_CPU_OP_US
        matmul_us = float(self_us[in_compute & is_compute_op].sum())
        elementwise_us = float(self_us[in_compute & ~is_compute_op & large].sum())
        op_mix = {"matmul/conv": 100 * matmul_us / compute_us,
                  "large elementwise/other ops": 100 * elementwise_us / compute_us,
                  "small ops and framework overhead": max(0.0, 100 * (1 - (matmul_us + elementwise_us) / compute_us))}
        median_self = float(np.median(self_us[in_compute]))
        op_table = _op_table(ops, self_us, in_compute, compute_us, steps)
    return HostProfile(
        phase_ms_per_step=phase_ms,
        phase_share_pct={name: 100 * ms / step_ms for name, ms in phase_ms.items()},
        ops_per_step=float(in_compute.sum()) / steps,
        item_calls_per_step=float(items.sum()) / steps,
        compute_phase_ms_per_step=compute_us / 1e3 / steps,
        op_mix_pct=op_mix,
        median_op_self_us=median_self,
        op_table=op_table,
    )


def _self_times(ops: EventTable) -> np.ndarray:
    """Exclusive time of each CPU op: its duration minus its direct children's, per thread."""
    self_us = ops.dur_us.copy()
    for tid in np.unique(ops.tid):
        index = np.flatnonzero(ops.tid == tid)  # already in start order
        stack: list[int] = []
        for i in index:
            start = ops.start_us[i]
            while stack and ops.end_us[stack[-1]] <= start:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= min(ops.dur_us[i], ops.end_us[stack[-1]] - start)
            stack.append(i)
    return np.clip(self_us, 0, None)


def _op_table(ops: EventTable, self_us: np.ndarray, selected: np.ndarray, total_us: float, steps: int,
              top: int = 10) -> list[HostOpRow]:
    ids = ops.name_id[selected]
    totals = np.bincount(ids, weights=self_us[selected], minlength=len(ops.names))
    counts = np.bincount(ids, minlength=len(ops.names))
    rows = []
    for name_id in np.argsort(-totals)[:top]:
        if counts[name_id] == 0:
            break
        rows.append(HostOpRow(name=ops.names[name_id], calls_per_step=counts[name_id] / steps,
                              self_ms_per_step=totals[name_id] / 1e3 / steps,
                              mean_self_us=totals[name_id] / counts[name_id],
                              share_pct=100 * totals[name_id] / total_us))
    return rows


def _gpu_profile(trace: ParsedTrace, start: float, end: float, steps: int, window_us: float,
                 sites: list[SyncSite], syncs: SyncProfile, blocking_sites: list[SyncSite]) -> GpuProfile:
    k, mc = trace.kernels, trace.memcpys
    kernel_busy = intervals_of(k).clip(start, end)
    copies = intervals_of(mc).clip(start, end)
    any_busy = Intervals.of(kernel_busy, copies)
    gaps = kernel_busy.complement(start, end)
    queue = _launch_queue_us(trace)
    # an allocator call or a pageable copy drains the queue as a sync does: the relaunch after it is its cost too
    lockstep = _host_keeps_ahead_without_syncs(trace, kernel_busy, [*sites, *blocking_sites], window_us)
    split_us = _idle_split(trace, gaps, sync_shadow(sites, k, end, queue if lockstep else None),
                           sync_shadow(blocking_sites, k, end, queue if lockstep else None))
    kinds = [kernel_kind(name) for name in k.names]
    kind_of = np.array([kinds[i] for i in k.name_id]) if len(k) else np.array([])
    kernel_total = float(k.dur_us.sum()) or 1e-9
    queue_median = float(np.nanmedian(queue)) if queue is not None and np.isfinite(queue).any() else None
    d2h = mc.mask(lambda n: "DtoH" in n)
    return GpuProfile(
        busy_pct=100 * kernel_busy.total / window_us,
        copy_only_pct=100 * (any_busy.total - kernel_busy.total) / window_us,
        idle_pct=100 * (1 - any_busy.total / window_us),
        idle_split_pct={cause: 100 * us / window_us for cause, us in split_us.items()},
        kernels_per_step=len(k) / steps,
        kernel_ms_per_step=kernel_total / 1e3 / steps,
        short_kernel_count_pct=100 * float((k.dur_us < SHORT_KERNEL_US).mean()) if len(k) else 0.0,
        short_kernel_time_pct=100 * float(k.dur_us[k.dur_us < SHORT_KERNEL_US].sum()) / kernel_total,
        median_kernel_us=float(np.median(k.dur_us)) if len(k) else 0.0,
        kernel_kind_pct={kind: 100 * float(k.dur_us[kind_of == kind].sum()) / kernel_total
                         for kind in sorted(set(kinds))} if len(k) else {},
        kernel_table=_kernel_table(k, kinds, kernel_total, steps),
        memcpy_table=_memcpy_table(mc, kernel_busy, steps),
        launch_queue_median_us=queue_median,
        sync_calls_per_step=dict(syncs.by_call_per_step),
        d2h_copies_per_step=float(d2h.sum()) / steps,
    )


def _host_keeps_ahead_without_syncs(trace: ParsedTrace, kernel_busy: Intervals, sites: list[SyncSite],
                                     window_us: float) -> bool:
    """Would the host stay ahead of the GPU if the syncs went? Yes when the GPU's work takes at least as long as
    the host's own work: then the lockstep relaunch after each sync is the sync's cost, not launch overhead (a host
    slower than the GPU would leave those gaps anyway). The host's work is the smaller of its time not blocked in
    syncs and the time its ops and runtime calls took outside them: the first also holds time the host spent
    waiting outside any recorded call (on the H200, a loss calling torch.cuda.empty_cache() left 4.8 ms a step of
    such time beside 2.6 ms of ops, and removing the call took 38-49% off the step)."""
    in_step = [s for s in sites if s.in_step]
    if not in_step:
        return False
    blocked = Intervals.union(np.array([s.start_us for s in in_step]), np.array([s.return_us for s in in_step]))
    if blocked.total <= 0:
        return False
    host_ops = Intervals.of(intervals_of(trace.cpu_ops), intervals_of(trace.runtime))
    host_work_us = min(window_us - blocked.total, host_ops.total - host_ops.overlap(blocked))
    return kernel_busy.total >= LOCKSTEP_HOST_FRACTION * host_work_us


def _idle_split(trace: ParsedTrace, gaps: Intervals, sync_shadow: Intervals,
                blocking_shadow: Intervals) -> dict[str, float]:
    """Split the time with no kernel running by what the host was doing, in priority order.

    Data wait (the `data` phase), then host-to-device copies (the h2d phase or an H2D copy in flight), then syncs,
    then allocator calls and blocking copies/memsets (runtime_calls.py: cudaFree waits for the GPU, then the step's
    tensors are cudaMalloc'ed again), then a collective's host op or an FSDP hook (communication), then
    launch/framework work (any CPU op or runtime call), then other. A sync's share runs from the start of the op that
    synced until the first kernel after the host got control back: the host drained the queue, so the GPU
    waits for everything the host does until its next launch lands, launches included.
    """
    rt, mc = trace.runtime, trace.memcpys
    data = phase_intervals(trace, ("data",))
    h2d = Intervals.of(phase_intervals(trace, ("h2d",)), intervals_of(mc, mc.mask(lambda n: "HtoD" in n)))
    host_busy = Intervals.of(intervals_of(trace.cpu_ops), intervals_of(rt), phase_intervals(trace, COMPUTE_PHASES))
    # a host inside a collective or an FSDP hook waits on communication, which is not launch overhead
    layers = [("waiting for data", data), ("waiting on H2D copies", h2d), ("host-device syncs", sync_shadow),
              ("allocator and blocking calls", blocking_shadow), ("waiting on communication", communication_host(trace)),
              ("launch / framework overhead", host_busy)]
    covered = Intervals(np.empty(0), np.empty(0))
    previous = np.zeros(len(gaps))
    split = {}
    for cause, layer in layers:
        covered = Intervals.of(covered, layer)
        now = covered.overlap_each(gaps)
        split[cause] = float((now - previous).sum())
        previous = now
    split["other"] = float(((gaps.end - gaps.start) - previous).sum())
    return {cause: split[cause] for cause in IDLE_CAUSES}


def _kernel_table(k: EventTable, kinds: list[str], total_us: float, steps: int, top: int = 10) -> list[KernelRow]:
    if not len(k):
        return []
    totals = np.bincount(k.name_id, weights=k.dur_us, minlength=len(k.names))
    counts = np.bincount(k.name_id, minlength=len(k.names))
    rows = []
    for name_id in np.argsort(-totals)[:top]:
        rows.append(KernelRow(name=k.names[name_id], kind=kinds[name_id], count_per_step=counts[name_id] / steps,
                              ms_per_step=totals[name_id] / 1e3 / steps, mean_us=totals[name_id] / counts[name_id],
                              share_pct=100 * totals[name_id] / total_us))
    return rows


def _memcpy_table(mc: EventTable, kernel_busy: Intervals, steps: int) -> list[MemcpyRow]:
    if not len(mc):
        return []
    kinds = np.array([memcpy_kind(mc.names[i]) for i in mc.name_id])
    rows = []
    for kind in sorted(set(kinds)):
        mask = kinds == kind
        dur_us = float(mc.dur_us[mask].sum())
        copied = Intervals.union(mc.start_us[mask], mc.end_us[mask])
        overlapped = kernel_busy.overlap(copied)
        total_bytes = float(mc.extra[mask].sum())
        rows.append(MemcpyRow(kind=str(kind), count_per_step=float(mask.sum()) / steps,
                              ms_per_step=dur_us / 1e3 / steps, mb_per_step=total_bytes / 2**20 / steps,
                              gbps=total_bytes / (dur_us * 1e3) if dur_us else None,
                              overlap_with_compute_pct=100 * overlapped / copied.total if copied.total else 0.0))
    return rows

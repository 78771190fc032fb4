"""Host-device syncs: every blocking point of the profiled steps, found once and attributed to its source.

On a GPU trace a sync is a runtime call that blocks the host until the device has caught up:
cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize (and their driver-API forms), a blocking
cudaMemcpy out of the device, and a device-to-host cudaMemcpyAsync into pageable memory (the driver stages it
and waits). The blocking calls made inside one op call are one *sync site*, named after the outermost aten op
around them on the same thread (`aten::item`, `aten::nonzero`, `aten::to` for `.cpu()`, ...), or an explicit
synchronize when no op encloses them; with Python stacks in the trace, also after the Python function that
called it. On a CPU trace nothing blocks: the sites are the calls of ops that sync on CUDA (SYNC_OPS).

Sites inside the DataLoader (the `data` phase, `DataLoader.__next__`) are the input pipeline's host work and are
counted apart; on a CPU trace, so are those in the optimizer (optimizers read CPU step counters with .item()). So
is DDP's own bookkeeping: in its first 10 iterations, and every 100th after, DistributedDataParallel.forward reads
the CUDA timer events of the iteration before (its runtime-stats logging, `_set_ddp_runtime_logging_sample_rate`):
event synchronizes before the first op of its forward, gone in a steady run (seen on a profiled 2-GPU run, where
they were named the bottleneck).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.diagnose.intervals import Intervals
from perflab.diagnose.op_graph import ModuleLookup, is_user_frame
from perflab.diagnose.phases import (MODEL_PHASES, PHASES, loader_intervals, phase_intervals,
                                     step_intervals)
from perflab.results.records import Record
from perflab.diagnose.trace import EventTable, ParsedTrace

BLOCKING_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                  "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"}
COPY_CALLS = {"cudaMemcpy", "cudaMemcpyAsync", "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpy", "cuMemcpyAsync"}
# Ops that always make the host wait for the device on CUDA (a CPU trace counts these): a value read on the
# host, or an output whose size depends on the data (bincount reads its input's maximum). Ops that sync only
# with some arguments (repeat_interleave without output_size, histc without a range) are left to the GPU
# trace, where their blocking calls show them.
SYNC_OPS = {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::nonzero",
            "aten::argwhere", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
            "aten::unique_dim", "aten::unique_consecutive", "aten::bincount"}
EXPLICIT_SYNC = "explicit synchronize (no op)"  # the site's name when no op encloses the blocking call
EVENT_SYNC_CALLS = {"cudaEventSynchronize", "cuEventSynchronize"}
DDP_FORWARD = "DistributedDataParallel.forward"  # the record_function range DDP puts around its forward
DDP_LOGGING = "DDP's runtime-stats logging (its first 10 iterations, then every 100th)"
BUSY_AGAIN_QUEUE_US = 20.0  # a kernel that waited this long after its launch found the GPU busy: the host is ahead


@dataclass
class SyncSite:
    """One blocking point: the op that caused it, the calls that blocked, and where the host was."""

    start_us: float  # the source op's start (the call's, for an explicit synchronize)
    return_us: float  # when the host got control back
    op: str
    calls: tuple[str, ...]
    python: Optional[str]  # "file.py(line): function" of the calling frame, when the trace has stacks
    phase: Optional[str]  # perflab phase around it (forward, backward, ...), None outside them
    in_loader: bool
    module: Optional[str] = None  # the nn.Module path around it (perflab's module ranges or with_stack frames)
    framework: Optional[str] = None  # a framework's own bookkeeping (DDP_LOGGING), not the step's work
    tid: int = -1  # the host thread

    @property
    def in_step(self) -> bool:
        """A sync of the step's own work: neither the input pipeline's nor a framework's bookkeeping."""
        return not self.in_loader and self.framework is None


@dataclass
class SyncProfile(Record):
    """Sync sites per profiled step, by source; those inside the DataLoader are counted apart."""

    source: str  # what a site is on this trace: blocking runtime calls (GPU) or ops that sync on CUDA (CPU)
    per_step: float  # sites in the step, outside the DataLoader
    by_op_per_step: dict[str, float] = field(default_factory=dict)
    by_call_per_step: dict[str, float] = field(default_factory=dict)
    by_python_per_step: dict[str, float] = field(default_factory=dict)
    by_module_per_step: dict[str, float] = field(default_factory=dict)
    by_phase_per_step: dict[str, float] = field(default_factory=dict)
    in_model_per_step: float = 0.0  # in forward/backward
    in_compute_per_step: float = 0.0  # outside the data and h2d phases: what a CUDA graph of the step would hold
    ms_per_step: float = 0.0  # host time from each site's start until it returned
    in_loader_per_step: float = 0.0
    in_loader_by_op_per_step: dict[str, float] = field(default_factory=dict)
    framework_per_step: dict[str, float] = field(default_factory=dict)  # bookkeeping syncs, counted apart


def find_sync_sites(trace: ParsedTrace, start: float, end: float) -> list[SyncSite]:
    """Every sync site of the profiled steps (the window [start, end) when the trace marks no steps)."""
    steps = step_intervals(trace)
    if not len(steps):
        steps = Intervals(np.array([start]), np.array([end]))
    sites = _gpu_sites(trace) if trace.has_gpu else _cpu_sites(trace)
    sites = [site for site in sites if steps.contains(np.array([site.start_us]))[0]]
    if not trace.has_gpu:
        optimizer = phase_intervals(trace, ("optimizer",))
        sites = [site for site in sites if not optimizer.contains(np.array([site.start_us]))[0]]
    return sites


def sync_profile(sites: list[SyncSite], steps: int, on_gpu: bool) -> SyncProfile:
    """Counts per step of the sites, by op, runtime call, Python frame and phase."""
    in_step = [site for site in sites if site.in_step]
    loader = [site for site in sites if site.in_loader]

    def per_step(counter: Counter) -> dict[str, float]:
        return {key: count / steps for key, count in counter.most_common()}

    return SyncProfile(
        source="blocking runtime calls" if on_gpu else "ops that sync on CUDA (nothing blocks on a CPU run)",
        per_step=len(in_step) / steps,
        by_op_per_step=per_step(Counter(site.op for site in in_step)),
        by_call_per_step=per_step(Counter(call for site in in_step for call in site.calls)),
        by_python_per_step=per_step(Counter(site.python for site in in_step if site.python)),
        by_module_per_step=per_step(Counter(site.module for site in in_step if site.module)),
        by_phase_per_step=per_step(Counter(site.phase or "outside phases" for site in in_step)),
        in_model_per_step=sum(site.phase in MODEL_PHASES for site in in_step) / steps,
        in_compute_per_step=sum(site.phase not in ("data", "h2d") for site in in_step) / steps,
        ms_per_step=sum(site.return_us - site.start_us for site in in_step) / 1e3 / steps,
        in_loader_per_step=len(loader) / steps,
        in_loader_by_op_per_step=per_step(Counter(site.op for site in loader)),
        framework_per_step=per_step(Counter(site.framework for site in sites if site.framework)),
    )


def sync_shadow(sites: list[SyncSite], kernels: EventTable, end: float,
                queue_us: Optional[np.ndarray] = None) -> Intervals:
    """Where the GPU's idle time is the syncs' fault: from each site's start until the GPU is busy again.

    The host drained the queue, so the GPU waits for everything the host does next. Without `queue_us` that is
    until the first kernel that starts after the sync returned. With it (per kernel, in start order: how long the
    kernel waited between its launch and its start; pass it when the host would keep ahead of the GPU without the
    syncs), the GPU is busy again only at the first kernel that waited in the queue: until then the host relaunches
    the step from behind, in lockstep, and every gap of that relaunch is the sync's too.
    """
    sites = [site for site in sites if site.in_step]
    if not sites:
        return Intervals(np.empty(0), np.empty(0))
    starts = np.array([site.start_us for site in sites])
    returns = np.array([site.return_us for site in sites])
    order = np.argsort(kernels.start_us, kind="stable")
    kernel_starts = kernels.start_us[order]
    index = np.searchsorted(kernel_starts, returns, side="left")
    if queue_us is not None and len(kernel_starts):
        queued = np.flatnonzero(np.nan_to_num(queue_us[order], nan=0.0) > BUSY_AGAIN_QUEUE_US)
        # the first queued kernel at or after the first kernel after the sync; never past the next sync
        later = np.searchsorted(queued, index, side="left")
        busy_again = np.full(len(index), len(kernel_starts))
        if len(queued):
            busy_again = np.where(later < len(queued), queued[np.clip(later, 0, len(queued) - 1)], len(kernel_starts))
        next_site = np.append(starts[1:], end)
        following = np.where(busy_again < len(kernel_starts),
                             kernel_starts[np.clip(busy_again, 0, len(kernel_starts) - 1)], end)
        following = np.minimum(following, np.maximum(next_site, returns))
    else:
        following = np.where(index < len(kernel_starts), kernel_starts[np.clip(index, 0, len(kernel_starts) - 1)],
                             end)
    return Intervals.union(starts, np.maximum(following, returns))


def _gpu_sites(trace: ParsedTrace) -> list[SyncSite]:
    labels = blocking_labels(trace)
    if not labels:
        return []
    context = SiteContext(trace)
    sites = runtime_call_sites(trace, labels, context=context)
    for site in sites:
        if context.is_ddp_logging(site, site.tid):
            site.framework = DDP_LOGGING
    return sites


def runtime_call_sites(trace: ParsedTrace, labels: dict[int, str], no_op: str = EXPLICIT_SYNC,
                       context: Optional[SiteContext] = None) -> list[SyncSite]:
    """The runtime calls `labels` names (index -> label), one site per op call that made them (`no_op` names a
    call outside every op), with where the host was: Python frame, module, phase, DataLoader. In start order."""
    rt = trace.runtime
    context = context or SiteContext(trace)
    grouped: dict[object, list[int]] = {}
    for index in sorted(labels):
        op = context.source_op(rt.start_us[index], rt.end_us[index], int(rt.tid[index]))
        grouped.setdefault(op if op is not None else ("call", index), []).append(index)
    sites = []
    for key, calls in grouped.items():
        op_index = key if not isinstance(key, tuple) else None
        start = trace.cpu_ops.start_us[op_index] if op_index is not None else rt.start_us[calls[0]]
        sites.append(context.site(
            start=float(start), returned=float(max(rt.end_us[i] for i in calls)), tid=int(rt.tid[calls[0]]),
            op=trace.cpu_ops.name(op_index) if op_index is not None else no_op,
            calls=tuple(labels[i] for i in calls)))
    return sorted(sites, key=lambda site: site.start_us)


def blocking_labels(trace: ParsedTrace) -> dict[int, str]:
    """Runtime call index -> label, for the calls that block the host."""
    rt, mc = trace.runtime, trace.memcpys
    copy_kind = {int(corr): name for corr, name in zip(mc.correlation, (mc.name(i) for i in range(len(mc))))
                 if corr >= 0}
    labels = {}
    for index in np.flatnonzero(rt.mask(lambda n: n in BLOCKING_CALLS or n in COPY_CALLS)):
        name = rt.name(index)
        if name in BLOCKING_CALLS:
            labels[int(index)] = name
            continue
        copy = copy_kind.get(int(rt.correlation[index]), "")
        blocking_call = "Async" not in name
        if "DtoH" in copy and ("Pageable" in copy or blocking_call):
            labels[int(index)] = f"{name} (D2H {'pageable' if 'Pageable' in copy else 'blocking'})"
        elif blocking_call and not copy:
            labels[int(index)] = name
    return labels


def _cpu_sites(trace: ParsedTrace) -> list[SyncSite]:
    ops = trace.cpu_ops
    candidates = np.flatnonzero(ops.mask(lambda n: n in SYNC_OPS))
    context = SiteContext(trace)
    sites = []
    for index in candidates:
        start, end = ops.start_us[candidates], ops.end_us[candidates]
        # an enclosing candidate (of two with the same span, the one listed first): the nonzero inside
        # masked_select, the _local_scalar_dense inside item, are the same sync
        encloses = ((ops.tid[candidates] == ops.tid[index]) & (start <= ops.start_us[index])
                    & (end >= ops.end_us[index])
                    & ((start < ops.start_us[index]) | (end > ops.end_us[index]) | (candidates < index)))
        if encloses.any():
            continue
        sites.append(context.site(start=float(ops.start_us[index]), returned=float(ops.end_us[index]),
                                  tid=int(ops.tid[index]), op=ops.name(index), calls=()))
    return sites


class SiteContext:
    """Looks up, for a time on a thread, the enclosing op, Python frame, perflab phase and DataLoader range."""

    def __init__(self, trace: ParsedTrace) -> None:
        self.trace = trace
        self.ops = trace.cpu_ops
        self.aten = self.ops.mask(lambda n: n.startswith("aten::"))
        self.loader = loader_intervals(trace)
        self.phases = {name: phase_intervals(trace, (name,)) for name in PHASES}
        python = trace.python
        self.user_frame = python.mask(is_user_frame)
        self.named_frame = python.mask(lambda n: not n.startswith(("<built-in", "nn.Module:")))
        self.modules = ModuleLookup(trace)
        ann = trace.annotations
        self.ddp_forward = np.flatnonzero(ann.mask(lambda n: n == DDP_FORWARD))

    def is_ddp_logging(self, site: SyncSite, tid: int) -> bool:
        """An event synchronize of no op inside DistributedDataParallel.forward, before the first aten op of that
        forward on its thread: DDP reading its timer events (a user's sync would be inside the model's ops)."""
        if site.op != EXPLICIT_SYNC or not set(site.calls) <= EVENT_SYNC_CALLS or not len(self.ddp_forward):
            return False
        ann, ops = self.trace.annotations, self.ops
        inside = self.ddp_forward[(ann.tid[self.ddp_forward] == tid) & (ann.start_us[self.ddp_forward] <= site.start_us)
                                  & (ann.end_us[self.ddp_forward] >= site.return_us)]
        if not len(inside):
            return False
        begin, end = ann.start_us[inside[-1]], ann.end_us[inside[-1]]
        first_op = self.aten & (ops.tid == tid) & (ops.start_us >= begin) & (ops.start_us <= end)
        return not first_op.any() or site.return_us <= ops.start_us[first_op].min()

    def source_op(self, start: float, end: float, tid: int) -> Optional[int]:
        """The outermost aten op around [start, end] on this thread, else the innermost op; None without one."""
        ops = self.ops
        around = (ops.tid == tid) & (ops.start_us <= start) & (ops.end_us >= end)
        for candidates, pick in ((around & self.aten, np.argmin), (around, np.argmax)):
            index = np.flatnonzero(candidates)
            if len(index):
                return int(index[pick(ops.start_us[index])])
        return None

    def site(self, start: float, returned: float, tid: int, op: str, calls: tuple[str, ...]) -> SyncSite:
        point = np.array([start])
        phase = next((name for name in ("forward", "backward", "optimizer", "augment", "h2d", "data", "step")
                      if self.phases[name].contains(point)[0]), None)
        return SyncSite(start_us=start, return_us=returned, op=op, calls=calls, python=self._frame(start, tid),
                        module=self.modules.at(start, tid), tid=tid,
                        phase=phase, in_loader=bool(self.loader.contains(point)[0]))

    def _frame(self, t: float, tid: int) -> Optional[str]:
        """The innermost Python frame of the user's code around `t` (else the innermost named one)."""
        py = self.trace.python
        if not len(py):
            return None
        around = (py.tid == tid) & (py.start_us <= t) & (py.end_us >= t)
        for candidates in (around & self.user_frame, around & self.named_frame):
            index = np.flatnonzero(candidates)
            if len(index):
                return py.name(int(index[np.argmax(py.start_us[index])]))
        return None

"""The CUDA runtime API, accounted: per profiled step, the calls that block the host or churn the allocator.

Five kinds of call, each counted with its host time, the Python frame (else module, else op) that made it, and the
GPU idle it leaves: from the start of the op that made it until the first kernel after it returned, as for a sync
(sync_sites.sync_shadow), inside the GPU's busy/idle window.

- allocator: cudaMalloc/cudaFree (and their async, driver, virtual-memory and pinned-host forms). The caching
  allocator reuses its blocks, so after warm-up a step calls none; cudaFree waits for the device.
- sync API: cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize (sync.py names their sites).
- synchronous copy / memset: cudaMemcpy*/cudaMemset* without the Async suffix: they block the host.
- pageable async copy: an Async copy whose memcpy is from or to pageable memory: the driver stages it
  synchronously (from pageable memory it drains the stream first).

A GPU trace only: a CPU trace holds no runtime calls (None then).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.diagnose.intervals import Intervals, intervals_of
from perflab.diagnose.phases import step_intervals
from perflab.results.records import Record
from perflab.diagnose.sync_sites import (BLOCKING_CALLS, SiteContext, SyncSite, blocking_labels, runtime_call_sites,
                                         sync_shadow)
from perflab.diagnose.trace import ParsedTrace

ALLOCATOR = "allocator"
SYNC_API = "sync API"
SYNC_COPY = "synchronous copy"
SYNC_MEMSET = "synchronous memset"
PAGEABLE_COPY = "pageable async copy"
KINDS = (ALLOCATOR, SYNC_API, SYNC_COPY, SYNC_MEMSET, PAGEABLE_COPY)
ALLOCATOR_CALLS = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cuMemAlloc", "cuMemAlloc_v2",
                   "cuMemFree", "cuMemFree_v2", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemCreate", "cuMemRelease",
                   "cuMemMap", "cuMemUnmap", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost", "cuMemHostAlloc",
                   "cuMemFreeHost", "cudaHostRegister", "cudaHostUnregister"}
NO_OP = "no op"  # the site's op when no op encloses the call (torch.cuda.empty_cache, a user's own call)
EMPTY_CACHE = "torch.cuda.empty_cache()"
ALLOCATOR_LIMIT = "the allocator freeing its cache inside ops, at its memory limit"
TOP_CALLERS = 3


@dataclass
class ApiKind(Record):
    """One kind of runtime call in the profiled steps."""

    calls_per_step: float
    sites_per_step: float  # op calls that made them
    ms_per_step: float  # host time from each site's start until its last call returned
    gpu_idle_pct: float  # GPU idle from each site until the GPU is busy again, share of the GPU window
    steps_with_calls: int  # profiled steps that hold at least one
    by_call_per_step: dict[str, float] = field(default_factory=dict)
    by_caller_per_step: dict[str, float] = field(default_factory=dict)  # Python frame, else module, else op


@dataclass
class RuntimeApiProfile(Record):
    """The runtime calls of the profiled steps by kind, what made the allocator's, and the copies and memsets that
    neither the sync rule (a sync in the same op) nor the copy rule (the input copies) reports: `unclaimed`."""

    steps: int
    kinds: dict[str, ApiKind]
    allocator_causes_per_step: dict[str, float] = field(default_factory=dict)
    unclaimed: Optional[ApiKind] = None


@dataclass
class RuntimeCalls:
    """The accounting, and the sites whose idle is theirs alone: the allocator's and the unclaimed copies' (the idle
    split gives their shadow its own cause, ahead of launch overhead)."""

    profile: RuntimeApiProfile
    blocking_sites: list[SyncSite]


def runtime_calls(trace: ParsedTrace, start: float, gpu_start: float, end: float,
                  steps: int) -> Optional[RuntimeCalls]:
    """The runtime API per profiled step of a GPU trace; None for a CPU trace (it holds no runtime calls)."""
    if not trace.has_gpu or not len(trace.runtime):
        return None
    window = _Window(trace, start, gpu_start, end, steps)
    context = SiteContext(trace)
    by_kind = {kind: window.in_step(runtime_call_sites(trace, labels, NO_OP, context))
               for kind, labels in _labels_by_kind(trace).items()}
    synced = {site.start_us for site in runtime_call_sites(trace, blocking_labels(trace), NO_OP, context)}
    unclaimed = [site for kind in (SYNC_COPY, SYNC_MEMSET, PAGEABLE_COPY) for site in by_kind[kind]
                 if site.start_us not in synced and not _input_copy(site, kind)]
    causes = Counter(_allocator_cause(trace, site) for site in by_kind[ALLOCATOR])
    profile = RuntimeApiProfile(steps=steps, kinds={kind: window.kind(sites) for kind, sites in by_kind.items() if sites},
                                allocator_causes_per_step={cause: n / steps for cause, n in causes.most_common()},
                                unclaimed=window.kind(unclaimed) if unclaimed else None)
    return RuntimeCalls(profile, [*by_kind[ALLOCATOR], *unclaimed])


def _labels_by_kind(trace: ParsedTrace) -> dict[str, dict[int, str]]:
    """For each kind, runtime call index -> call name."""
    rt, mc = trace.runtime, trace.memcpys
    pageable = {int(c) for c, name_id in zip(mc.correlation, mc.name_id) if c >= 0 and "Pageable" in mc.names[name_id]}
    labels: dict[str, dict[int, str]] = {kind: {} for kind in KINDS}
    for index in range(len(rt)):
        name = rt.name(index)
        kind = _kind(name, int(rt.correlation[index]) in pageable)
        if kind is not None:
            labels[kind][index] = name
    return labels


def _kind(name: str, pageable_copy: bool) -> Optional[str]:
    """The kind of one runtime call, None for the rest (launches, events, async copies between pinned memory)."""
    if name in ALLOCATOR_CALLS:
        return ALLOCATOR
    if name in BLOCKING_CALLS:
        return SYNC_API
    is_async = "Async" in name
    if name.startswith(("cudaMemcpy", "cuMemcpy")):
        return PAGEABLE_COPY if is_async and pageable_copy else (None if is_async else SYNC_COPY)
    if name.startswith(("cudaMemset", "cuMemset")) and not is_async:
        return SYNC_MEMSET
    return None


def _input_copy(site: SyncSite, kind: str) -> bool:
    """A pageable copy of the inputs (the h2d or data phase, the DataLoader): the copy rule reports those."""
    return kind == PAGEABLE_COPY and (site.phase in ("h2d", "data") or site.in_loader)


def _allocator_cause(trace: ParsedTrace, site: SyncSite) -> str:
    """empty_cache (its frame on the Python stack, or frees outside every op), the allocator at its limit inside
    an op, or the calling op."""
    if _on_stack(trace, site, "empty_cache") or (site.op == NO_OP and "Free" in " ".join(site.calls)):
        return EMPTY_CACHE
    if site.op != NO_OP and any("Free" in call for call in site.calls):
        return ALLOCATOR_LIMIT
    return site.op


def _on_stack(trace: ParsedTrace, site: SyncSite, function: str) -> bool:
    """Whether a Python frame of `function` is open on the site's thread at its start (traces recorded with_stack)."""
    py = trace.python
    if not len(py):
        return False
    around = (py.tid == site.tid) & (py.start_us <= site.start_us) & (py.end_us >= site.start_us)
    return any(py.name(int(i)).endswith(f": {function}") for i in np.flatnonzero(around))


class _Window:
    """The profiled steps and the GPU's idle gaps: which sites count, and the numbers of a kind."""

    def __init__(self, trace: ParsedTrace, start: float, gpu_start: float, end: float, steps: int) -> None:
        self.steps_in = step_intervals(trace)
        if not len(self.steps_in):
            self.steps_in = Intervals(np.array([start]), np.array([end]))
        ann = trace.annotations  # each step's start (the union above merges steps that touch)
        step_starts = ann.start_us[ann.mask(lambda n: n.startswith("ProfilerStep#"))]
        self.step_starts = np.sort(step_starts) if len(step_starts) else np.array([start])
        self.kernels = trace.kernels
        self.gaps = intervals_of(trace.kernels).complement(gpu_start, end)
        self.gpu_window_us = max(end - gpu_start, 1e-9)
        self.end = end
        self.steps = steps

    def in_step(self, sites: list[SyncSite]) -> list[SyncSite]:
        """The sites of the step's own work: inside a profiled step, not a framework's bookkeeping."""
        return [site for site in sites if site.in_step and self.steps_in.contains(np.array([site.start_us]))[0]]

    def kind(self, sites: list[SyncSite]) -> ApiKind:
        """Counts, host time, GPU idle and callers of these sites, per step."""
        starts = np.array([site.start_us for site in sites])
        step_index = np.searchsorted(self.step_starts, starts, side="right") - 1
        idle = self.gaps.overlap(sync_shadow(sites, self.kernels, self.end))
        return ApiKind(
            calls_per_step=sum(len(site.calls) for site in sites) / self.steps,
            sites_per_step=len(sites) / self.steps,
            ms_per_step=sum(site.return_us - site.start_us for site in sites) / 1e3 / self.steps,
            gpu_idle_pct=100 * idle / self.gpu_window_us,
            steps_with_calls=len(set(step_index.tolist())),
            by_call_per_step=self._per_step(Counter(call for site in sites for call in site.calls)),
            by_caller_per_step=dict(list(self._per_step(Counter(_caller(site) for site in sites)).items())[:TOP_CALLERS]))

    def _per_step(self, counter: Counter) -> dict[str, float]:
        return {key: count / self.steps for key, count in counter.most_common()}


def _caller(site: SyncSite) -> str:
    """The Python frame that made the calls, else the module around them, else the op."""
    return site.python or (f"module {site.module}" if site.module else site.op)

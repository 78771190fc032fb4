"""Communication in one rank's trace: NCCL kernel time, the share of it overlapped by compute kernels, and
the exposed (non-overlapped) communication per step, which the step waits for.

NCCL kernels are matched by name prefix, whatever the NCCL version calls them: `ncclKernel_*` (NCCL 2.x),
`ncclDevKernel_*` (NCCL >= 2.19, which HolisticTraceAnalysis missed: its issues #208, #247) and any other
`nccl*`, with or without a `void ` / namespace prefix as some CUPTI versions print them.

Per kind of collective (all-reduce, all-gather, reduce-scatter, ...): calls and ms per step, the mean message and
the bus bandwidth it achieved (nccl-tests' convention, perflab/calibrate_collectives.py) where the profiler recorded
the message sizes on the kernels. A kernel's time includes waiting for the slowest peer, so the achieved figure is
a lower bound of what the link did. The GPU idle while the host is inside a collective or an FSDP hook (FSDP2
all-gathers wait on the host) is exposed communication too: `host_wait_ms_per_step`, which the idle split of the
trace summary gives this cause rather than "launch / framework overhead".
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perflab.calibrate_collectives import KINDS as BUS_KINDS, bus_factor
from perflab.diagnose.intervals import Intervals, intervals_of
from perflab.results.records import Record
from perflab.diagnose.trace import ParsedTrace, step_window

NCCL_KERNEL = re.compile(r"^\s*(?:void\s+)?(?:[A-Za-z_]\w*::)*nccl", re.IGNORECASE)
TOP_COLLECTIVES = 5
# Host ops and ranges of a collective: the c10d ops, the profiler's nccl:* / record_param_comms records, FSDP's hooks
# (not DDP's forward range, which holds the whole forward)
COMMUNICATION_HOST_OP = re.compile(r"^(c10d::|nccl:|record_param_comms|FSDP::)")
# Kernel names and c10d collective names -> one kind; checked in order (reduce_scatter before reduce)
KIND_PATTERNS = (("all_reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
                 ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
                 ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
                 ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
                 ("all_to_all", re.compile(r"all_?to_?all", re.IGNORECASE)),
                 ("send_recv", re.compile(r"send|recv", re.IGNORECASE)))
DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "long": 8, "int": 4,
               "byte": 1, "char": 1, "bool": 1, "short": 2}


def is_nccl_kernel(name: str) -> bool:
    """True for an NCCL kernel name (ncclKernel_*, ncclDevKernel_*, nccl*), prefixes like `void ` allowed."""
    return bool(NCCL_KERNEL.match(name))


@dataclass
class CollectiveKind(Record):
    """One kind of collective per step: calls, time, the mean message and the bus bandwidth over the kernels' time
    (None where no size was recorded), a sized call's median time and bus bytes, and, where the ranks' traces tell
    the transfer from the wait (ranks_waiting), the transfer's time and bus bandwidth and the time spent waiting."""

    calls_per_step: float
    ms_per_step: float
    mean_message_mb: Optional[float] = None
    busbw_gbps: Optional[float] = None
    median_call_ms: Optional[float] = None
    median_call_bus_mb: Optional[float] = None
    transfer_ms_per_call: Optional[float] = None
    transfer_busbw_gbps: Optional[float] = None
    waiting_ms_per_step: Optional[float] = None

    @property
    def bus_gbps(self) -> Optional[float]:
        """The bus bandwidth while moving data where the ranks' traces tell it from the wait, else over the
        kernels' time."""
        return self.transfer_busbw_gbps or self.busbw_gbps


@dataclass
class CommunicationProfile(Record):
    """Per step, in ms: NCCL kernel time (union over streams), the part of it under compute kernels, and the
    exposed rest; `exposed_share_pct` is the exposed time over the step time."""

    steps: int
    step_ms: float
    communication_ms_per_step: float
    overlapped_ms_per_step: float
    exposed_ms_per_step: float
    overlap_pct: float  # overlapped / communication (HolisticTraceAnalysis's comm/compute overlap)
    exposed_share_pct: float
    nccl_kernels_per_step: float
    top_collectives: dict[str, float] = field(default_factory=dict)  # kernel name -> ms per step
    by_kind: dict[str, CollectiveKind] = field(default_factory=dict)  # costliest first
    host_wait_ms_per_step: float = 0.0  # GPU idle while the host is in a collective or an FSDP hook
    group_size: Optional[int] = None


@dataclass
class RankCommunication(CommunicationProfile):
    """One rank's profile, as the gathered result lists them."""

    rank: int = 0


@dataclass
class GatheredCommunication(CommunicationProfile):
    """A result's communication: one rank's own profile, or the worst rank's of a gathered multi-rank result (with
    every rank's, and its by_kind widened by ranks_waiting). The rule reads this; metrics.collectives holds it as a
    dict (perflab/distributed/gather.py), read back with `from_dict` (keys an older result lacks take defaults)."""

    worst_rank: Optional[int] = None
    per_rank: list[RankCommunication] = field(default_factory=list)


@dataclass
class _KindTotals:
    """One kind's sums while its figures are counted."""

    calls: int = 0
    us: float = 0.0
    sized_us: float = 0.0
    bytes: float = 0.0
    bus_bytes: float = 0.0
    call_us: list[float] = field(default_factory=list)
    call_bus_bytes: list[float] = field(default_factory=list)

    def figures(self, steps: int) -> CollectiveKind:
        sized = self.sized_us > 0
        return CollectiveKind(
            calls_per_step=self.calls / steps, ms_per_step=self.us / 1e3 / steps,
            mean_message_mb=self.bytes / 2**20 / self.calls if sized else None,
            busbw_gbps=self.bus_bytes / self.sized_us / 1e3 if sized else None,
            median_call_ms=float(np.median(self.call_us)) / 1e3 if self.call_us else None,
            median_call_bus_mb=float(np.median(self.call_bus_bytes)) / 2**20 if self.call_bus_bytes else None)


def communication_profile(trace: ParsedTrace) -> Optional[CommunicationProfile]:
    """The communication figures of a GPU trace; None when it holds no kernels (a CPU trace)."""

    kernels = trace.kernels
    if len(kernels) == 0:
        return None
    start, end, steps = step_window(trace)
    steps = max(steps, 1)
    inside = (kernels.end_us > start) & (kernels.start_us < end)
    nccl = kernels.mask(is_nccl_kernel) & inside
    communication = intervals_of(kernels, nccl).clip(start, end)
    compute = intervals_of(kernels, ~nccl & inside).clip(start, end)
    total_us = communication.total
    overlapped_us = compute.overlap(communication)
    step_ms = (end - start) / 1e3 / steps
    exposed_ms = (total_us - overlapped_us) / 1e3 / steps
    return CommunicationProfile(
        steps=steps, step_ms=step_ms,
        communication_ms_per_step=total_us / 1e3 / steps,
        overlapped_ms_per_step=overlapped_us / 1e3 / steps,
        exposed_ms_per_step=exposed_ms,
        overlap_pct=100 * overlapped_us / total_us if total_us else 0.0,
        exposed_share_pct=100 * exposed_ms / step_ms if step_ms else 0.0,
        nccl_kernels_per_step=float(nccl.sum()) / steps,
        top_collectives=_top_collectives(kernels, nccl, steps),
        by_kind=collectives_by_kind(trace, nccl, steps),
        host_wait_ms_per_step=host_wait_us(trace, start, end) / 1e3 / steps,
        group_size=_group_size(trace),
    )


def collective_kind(name: str) -> str:
    """all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send_recv, or other, from a kernel's or a
    c10d op's name (ncclDevKernel_ReduceScatter_Sum_f32_RING_LL -> reduce_scatter)."""
    for kind, pattern in KIND_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


def message_bytes(kind: str, args: dict[str, Any]) -> Optional[float]:
    """The whole tensor's bytes of one recorded collective (nccl-tests' S: the all-reduced buffer, the gathered
    output, the scattered input), or None when the profiler did not record its sizes."""
    size = DTYPE_BYTES.get(str(args.get("dtype") or "").lower())
    elements = [args.get("In msg nelems"), args.get("Out msg nelems")]
    elements = [float(n) for n in elements if isinstance(n, (int, float))]
    if size is None or not elements:
        return None
    return max(elements) * size if kind in ("all_gather", "reduce_scatter") else elements[0] * size


def collectives_by_kind(trace: ParsedTrace, nccl: np.ndarray, steps: int) -> dict[str, CollectiveKind]:
    """Per kind: calls and ms per step, the mean message (MB), the bus bandwidth over the kernels' time (GB/s), and
    a sized call's median time and bus bytes (a collective's kernel also runs while it waits for the other ranks to
    arrive; ranks_waiting compares the ranks' medians to tell the transfer from the wait)."""
    kernels = trace.kernels
    group = _group_size(trace) or 2
    totals: dict[str, _KindTotals] = {}
    for index in np.flatnonzero(nccl):
        args = trace.collectives.get(int(kernels.correlation[index]), {})  # the trace's record_param_comms args
        kind = collective_kind(str(args.get("Collective name") or kernels.name(index)))
        entry = totals.setdefault(kind, _KindTotals())
        duration = float(kernels.dur_us[index])
        entry.calls += 1
        entry.us += duration
        sent = message_bytes(kind, args)
        if sent is not None and duration > 0:
            ranks = int(args.get("Group size") or group)
            bus = sent * bus_factor(kind if kind in BUS_KINDS else "all_gather", ranks)
            entry.sized_us += duration
            entry.bytes += sent
            entry.bus_bytes += bus
            entry.call_us.append(duration)
            entry.call_bus_bytes.append(bus)
    return {kind: entry.figures(steps) for kind, entry in sorted(totals.items(), key=lambda item: -item[1].us)}


def ranks_waiting(per_rank_by_kind: list[dict[str, CollectiveKind]], by_kind: dict[str, CollectiveKind]
                  ) -> dict[str, CollectiveKind]:
    """`by_kind` (one rank's) with, per kind every rank recorded sized calls of, the transfer told from the wait.

    A collective's kernel starts when its rank launches it and ends when the data has moved, so on a rank that
    arrives first it also holds the time the others take to arrive. The rank whose calls are quickest arrived last:
    its median call is the transfer (transfer_ms_per_call, and the bus bandwidth while moving data,
    transfer_busbw_gbps); the rest of this rank's time in that kind, waiting_ms_per_step, was spent waiting for the
    other ranks. On 2 H200s, FSDP2's all-gathers read 4 GB/s bus on rank 0 over their kernels' time, and 74 us a
    call (~190 GB/s) on rank 1. `by_kind`'s figures are copied, not changed."""
    widened = {kind: dataclasses.replace(figures) for kind, figures in by_kind.items()}
    for kind, figures in widened.items():
        medians = [kinds[kind].median_call_ms if kind in kinds else None for kinds in per_rank_by_kind]
        bus_mb = figures.median_call_bus_mb
        if len(medians) < 2 or any(median is None or median <= 0 for median in medians) or not bus_mb:
            continue
        transfer_ms = min(medians)
        figures.transfer_ms_per_call = transfer_ms
        figures.transfer_busbw_gbps = bus_mb * 2**20 / (transfer_ms / 1e3) / 1e9
        figures.waiting_ms_per_step = max(0.0, figures.ms_per_step - figures.calls_per_step * transfer_ms)
    return widened


def communication_host(trace: ParsedTrace) -> Intervals:
    """When the host is inside a collective's op or an FSDP hook (the idle split's "waiting on communication")."""
    def is_communication(name: str) -> bool:
        return bool(COMMUNICATION_HOST_OP.match(name))
    return Intervals.of(intervals_of(trace.cpu_ops, trace.cpu_ops.mask(is_communication)),
                        intervals_of(trace.annotations, trace.annotations.mask(is_communication)))


def host_wait_us(trace: ParsedTrace, start: float, end: float) -> float:
    """The time no kernel runs while the host is inside a collective's op or an FSDP hook, within [start, end]."""
    idle = intervals_of(trace.kernels).clip(start, end).complement(start, end)
    return communication_host(trace).clip(start, end).overlap(idle)


def _group_size(trace: ParsedTrace) -> Optional[int]:
    sizes = [args.get("Group size") for args in trace.collectives.values() if args.get("Group size")]
    if sizes:
        return int(max(sizes))
    world = (trace.distributed or {}).get("world_size")
    return int(world) if world else None


def _top_collectives(kernels, nccl: np.ndarray, steps: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for index in np.flatnonzero(nccl):
        name = kernels.name(index).split("(")[0]
        totals[name] = totals.get(name, 0.0) + float(kernels.dur_us[index]) / 1e3 / steps
    return dict(sorted(totals.items(), key=lambda item: -item[1])[:TOP_COLLECTIVES])

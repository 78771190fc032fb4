"""Was the machine busy with other work while a trial ran? CPU time of other processes, GPU neighbours.

Timings taken beside another busy process are not clean, and a low spread does not prove they are (a
steady neighbour slows every trial alike). So around each trial perflab reads, from /proc, how much CPU
time processes other than this run's used on the CPUs this run may use (all of them unless it is pinned: a
neighbour pinned to other cores, one job per GPU on a shared host, does not take its cores) (its own: this process and its children, the DataLoader workers,
and in a multi-GPU run the launcher's other ranks), and from NVML, which other processes hold the GPU; plus the
1-minute load average against the core count. A run whose trials saw more than BUSY_CORES of other CPU work, or
another process on its GPU, is marked `busy` and says so.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

from perflab.harness.nvml import device_handle
from perflab.ranks import LAUNCHER_PID_ENV
from perflab.results.metrics import Interference

BUSY_CORES = 0.5  # other processes' CPU use, in cores, above which a trial counts as contaminated
# /proc counts CPU time in ticks (10 ms at 100 Hz), each given to whatever ran at that instant: a trial of 20 ms (tiny
# steps on an H100) read 2 ticks of a kernel thread or an idle parent's wake-up as 0.9 cores. This many ticks are the
# count's own uncertainty and are taken off before a trial is judged busy.
QUANTISATION_TICKS = 2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def allowed_cpus() -> Optional[set[int]]:
    """The CPUs this process may run on (taskset, cgroups' cpusets), or None where the OS does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _busy(fields: list[str]) -> int:
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle


def _total_busy_ticks(cpus: Optional[set[int]] = None) -> Optional[int]:
    """Busy jiffies since boot of `cpus`, or of all CPUs, from /proc/stat (busy_ticks_of)."""
    try:
        with open("/proc/stat") as stream:
            return busy_ticks_of(stream.read(), cpus)
    except OSError:
        return None


def busy_ticks_of(proc_stat: str, cpus: Optional[set[int]] = None) -> Optional[int]:
    """Busy jiffies (user + nice + system + irq + softirq + steal) in a /proc/stat text, of `cpus` or of all CPUs.
    Work on other cores than this run may use does not take its cores: a job pinned beside it (one per GPU on a
    shared host) is not counted."""
    lines = [line.split() for line in proc_stat.splitlines() if line.startswith("cpu")]
    if not lines:
        return None
    if cpus is None:
        return _busy(lines[0][1:])
    return sum(_busy(line[1:]) for line in lines[1:] if line[0][3:].isdigit() and int(line[0][3:]) in cpus)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU jiffies used: utime + stime) of every live process, from one pass over /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stream:
                fields = stream.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
    return table


def _job_root() -> int:
    """The process this run's own processes descend from: in a rank, the launcher that started every rank (its
    sibling ranks are the same run, not other work); else this process."""
    return int(os.environ.get(LAUNCHER_PID_ENV) or os.getpid())


def _job_pids(processes: dict[int, tuple[int, int]]) -> set[int]:
    """This run's processes: the job root and every live descendant (ranks, DataLoader workers)."""
    root = _job_root()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root, os.getpid()}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _own_ticks(processes: dict[int, tuple[int, int]], own: set[int]) -> int:
    """CPU jiffies of this run's processes (`own`: _job_pids)."""
    return sum(processes[pid][1] for pid in own if pid in processes)


def gpu_neighbours(device_index: Optional[int], own: set[int]) -> list[int]:
    """PIDs of processes holding the GPU (NVML) other than `own` (this run's); empty when unknown."""
    if device_index is None:
        return []
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = device_handle(device_index)
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # NVML missing or not permitted (containers): no evidence either way
        return []
    return sorted({p.pid for p in processes if p.pid not in own})


@dataclass
class TrialLoad:
    """What else the machine did during one trial."""

    other_cpu_cores: Optional[float]  # mean cores busy with other processes' work (less the count's uncertainty)
    load_per_core: float
    gpu_neighbours: list[int] = field(default_factory=list)
    other_ticks: Optional[int] = None  # the raw count behind other_cpu_cores, and the trial's seconds: summed over
    seconds: float = 0.0  # a run's trials, short trials still tell a busy machine (summarize_load)

    @property
    def busy(self) -> bool:
        return bool(self.gpu_neighbours) or (self.other_cpu_cores or 0.0) > BUSY_CORES


def other_cores(ticks: int, seconds: float) -> float:
    """Cores of other work from a count of ticks over `seconds`, the count's own uncertainty taken off."""
    return max(0.0, (ticks - QUANTISATION_TICKS) / CLOCK_TICKS / max(seconds, 1e-6))


class LoadProbe:
    """Reads the machine's load at the start and the end of a trial."""

    def __init__(self, device_index: Optional[int]):
        self.device_index = device_index
        self.cores = os.cpu_count() or 1
        cpus = allowed_cpus()
        # all CPUs when the run may use them all: the one line of /proc/stat, not a sum over hundreds
        self.cpus = cpus if cpus is not None and len(cpus) < self.cores else None
        self._start: tuple[Optional[int], int, float] = (None, 0, 0.0)

    def begin(self) -> None:
        processes = _processes()
        self._start = (_total_busy_ticks(self.cpus), _own_ticks(processes, _job_pids(processes)), time.monotonic())

    def end(self) -> TrialLoad:
        total_before, own_before, began = self._start
        processes = _processes()
        own = _job_pids(processes)
        total_after, own_after = _total_busy_ticks(self.cpus), _own_ticks(processes, own)
        seconds = max(time.monotonic() - began, 1e-6)
        other = other_ticks = None
        if total_before is not None and total_after is not None:
            other_ticks = (total_after - total_before) - (own_after - own_before)
            other = other_cores(other_ticks, seconds)
        load = os.getloadavg()[0] / self.cores if hasattr(os, "getloadavg") else 0.0
        return TrialLoad(other, load, gpu_neighbours(self.device_index, own), other_ticks, seconds)


def summarize_load(loads: list[TrialLoad]) -> Interference:
    """The run's interference record for result.json: per trial, and whether any trial was busy."""
    busy = [i for i, load in enumerate(loads) if load.busy]
    others = [load.other_cpu_cores for load in loads if load.other_cpu_cores is not None]
    counted = [load for load in loads if load.other_ticks is not None]
    if counted:  # all trials together: trials too short to tell one by one (20 ms is two ticks) still add up
        together = other_cores(sum(load.other_ticks for load in counted), sum(load.seconds for load in counted))
        others.append(together)
        if together > BUSY_CORES and not busy:
            busy = list(range(len(loads)))
    return Interference(
        busy=bool(busy),
        busy_trials=busy,
        other_cpu_cores_max=max(others) if others else None,
        load_per_core_max=max((load.load_per_core for load in loads), default=None),
        gpu_neighbours=sorted({pid for load in loads for pid in load.gpu_neighbours}),
        threshold_cores=BUSY_CORES,
        method="CPU time of other processes during each trial on the CPUs this run may use (/proc/stat minus this "
               "run's processes: this one, its children and its sibling ranks), 1-minute load average per core, other processes on the GPU "
               "(NVML)",
    )


def busy_note(record: Optional[Interference]) -> Optional[str]:
    """One line for the run's notes when the machine was busy, else None."""
    if record is None or not record.busy:
        return None
    parts = []
    if record.other_cpu_cores_max is not None and record.other_cpu_cores_max > BUSY_CORES:
        parts.append(f"other processes used up to {record.other_cpu_cores_max:.1f} CPU cores")
    if record.gpu_neighbours:
        parts.append(f"other processes on the GPU: pids {', '.join(map(str, record.gpu_neighbours))}")
    trials = ", ".join(str(i + 1) for i in record.busy_trials)
    return (f"the machine was busy during trial(s) {trials} ({'; '.join(parts)}): these timings are not clean; "
            "compare declines to call changes significant on such runs unless --accept-noisy")

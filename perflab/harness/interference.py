"""Was the machine busy with other work while a trial ran? CPU time of other processes, GPU neighbours.

Timings taken beside another busy process are not clean, and a low spread does not prove they are (a
steady neighbour slows every trial alike). So around each trial perflab reads, from /proc: how much CPU time
processes other than this run's (this process, its children such as DataLoader workers, and in a multi-GPU run the
launcher's other ranks) used on the CPUs this run may use (all of them unless it is pinned: a neighbour pinned to
other cores, one job per GPU on a shared host, does not take its cores); how many other tasks stayed runnable
through the trial; and how long the timing process waited for a CPU. From NVML: which other processes hold the GPU;
plus the 1-minute load average against the core count. A trial that crossed any threshold below is marked `busy`,
and the run says so.
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
# The share of a trial the timing process spent runnable but waiting for a CPU (the scheduler's run-queue wait,
# /proc/self/task/*/schedstat, in ns: exact for a 20-ms trial, where ticks are not) above which, while this run's own
# processes did not fill its cores, another process held them. Pinned to one core beside two spinners, a 30-ms loop
# waited 53% of its time; alone, 0.1-11% (its own threads).
# Only read while no other process of this run used CPU in the trial (its wait could be for them).
RUN_QUEUE_BUSY_SHARE = 0.3
OWN_FILL = 0.9  # this run's processes using this share of its cores: its waits may be its own (workers, threads)
# Other tasks runnable at both ends of a trial (the kernel's procs_running, less this run's own runnable threads),
# beyond the cores this run may not use, from which a trial counts as busy: a trial of a few ms can run whole on one
# core while two spinners share the other, so neither ticks nor waits show them, yet identical runs so measured
# differed by 4.6% "significantly". One extra is a kernel thread's moment; two that stay are a neighbour.
RUNNABLE_OTHERS_BUSY = 2
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


def run_queue_wait_ns() -> Optional[int]:
    """Nanoseconds this process's threads have spent runnable but not running, since they started; None where
    the kernel does not say (no schedstat)."""
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, seen = 0, False
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat") as stream:
                total += int(stream.read().split()[1])
                seen = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total if seen else None


def runnable_tasks() -> Optional[int]:
    """Tasks (threads) runnable on the machine now: /proc/stat's procs_running."""
    try:
        with open("/proc/stat") as stream:
            for line in stream:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def own_runnable_tasks(own: set[int]) -> int:
    """Threads of this run's processes that are runnable now (state R), this one reading included."""
    count = 0
    for pid in own:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{pid}/task/{thread}/stat") as stream:
                    count += stream.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                continue
    return count


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
    run_queue_wait_share: Optional[float] = None  # of the trial, waiting for a CPU others held (None: own or unknown)
    others_runnable: Optional[int] = None  # other tasks runnable at both ends, beyond the cores not this run's

    @property
    def busy(self) -> bool:
        return bool(self.gpu_neighbours) or (self.other_cpu_cores or 0.0) > BUSY_CORES or \
            (self.run_queue_wait_share or 0.0) > RUN_QUEUE_BUSY_SHARE or \
            (self.others_runnable or 0) >= RUNNABLE_OTHERS_BUSY


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
        self._waited_before: Optional[int] = None
        self._others_before: Optional[int] = None
        self._own_before: dict[int, int] = {}

    def begin(self) -> None:
        processes = _processes()
        own = _job_pids(processes)
        self._own_before = {pid: processes[pid][1] for pid in own if pid in processes}
        self._start = (_total_busy_ticks(self.cpus), _own_ticks(processes, own), time.monotonic())
        self._waited_before = run_queue_wait_ns()
        self._others_before = self._others_runnable(own)

    def _others_runnable(self, own: set[int]) -> Optional[int]:
        """Other tasks runnable now beyond the cores this run may not use (a pinned neighbour's are its own)."""
        running = runnable_tasks()
        if running is None:
            return None
        not_ours = self.cores - len(self.cpus) if self.cpus is not None else 0
        return max(0, running - own_runnable_tasks(own) - not_ours)

    def _siblings_ran(self, processes: dict[int, tuple[int, int]], own: set[int]) -> bool:
        """Whether another of this run's processes (a sibling rank, a DataLoader worker) used CPU during the trial:
        then the timing process may have waited for its own run, and its wait tells nothing of other work (tune
        --nproc 2 on 2 cores had its trials "busy" from each rank waiting for the other)."""
        me = os.getpid()
        return any(processes[pid][1] > self._own_before.get(pid, 0) for pid in own if pid != me and pid in processes)

    def end(self) -> TrialLoad:
        waited_after = run_queue_wait_ns()
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
        own_cores = (own_after - own_before) / CLOCK_TICKS / seconds
        waited = None
        if self._waited_before is not None and waited_after is not None and \
                own_cores < OWN_FILL * len(self.cpus or range(self.cores)) and \
                not self._siblings_ran(processes, own):
            waited = (waited_after - self._waited_before) / 1e9 / seconds
        others_after = self._others_runnable(own)
        others = (min(self._others_before, others_after)
                  if self._others_before is not None and others_after is not None else None)
        return TrialLoad(other, load, gpu_neighbours(self.device_index, own), other_ticks, seconds, waited, others)


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
        run_queue_wait_max=max((load.run_queue_wait_share for load in loads
                                if load.run_queue_wait_share is not None), default=None),
        others_runnable_max=max((load.others_runnable for load in loads if load.others_runnable is not None),
                                default=None),
        method=("CPU time of other processes during each trial on the CPUs this run may use (/proc/stat minus this "
                "run's processes: this one, its children and its sibling ranks), 1-minute load average per core, "
                "other processes on the GPU (NVML), and how long the timing process waited for a CPU while its own "
                f"processes did not fill its cores (run-queue wait over {RUN_QUEUE_BUSY_SHARE:.0%} of a trial: busy), and "
                f"other tasks runnable at both ends of a trial ({RUNNABLE_OTHERS_BUSY} or more: busy)"),
    )


def busy_reasons(record: Interference) -> list[str]:
    """What made the run's record busy, one phrase per signal that crossed its threshold."""
    parts = []
    if record.other_cpu_cores_max is not None and record.other_cpu_cores_max > BUSY_CORES:
        parts.append(f"other processes used up to {record.other_cpu_cores_max:.1f} CPU cores")
    if record.others_runnable_max is not None and record.others_runnable_max >= RUNNABLE_OTHERS_BUSY:
        parts.append(f"{record.others_runnable_max} other tasks were runnable through a trial")
    if record.run_queue_wait_max is not None and record.run_queue_wait_max > RUN_QUEUE_BUSY_SHARE:
        parts.append(f"the timing process waited for a CPU {record.run_queue_wait_max:.0%} of a trial")
    if record.gpu_neighbours:
        parts.append(f"other processes on the GPU: pids {', '.join(map(str, record.gpu_neighbours))}")
    return parts


def busy_note(record: Optional[Interference]) -> Optional[str]:
    """One line for the run's notes when the machine was busy, else None."""
    if record is None or not record.busy:
        return None
    parts = busy_reasons(record)
    trials = ", ".join(str(i + 1) for i in record.busy_trials)
    return (f"the machine was busy during trial(s) {trials} ({'; '.join(parts)}): these timings are not clean; "
            "compare declines to call changes significant on such runs unless --accept-noisy")

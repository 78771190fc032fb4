"""Is the host's CPU speed itself steady? A fixed pure-Python loop timed in 3-s windows.

    python -m benchmarks.host_steadiness

Loader-fed runs on the H100 machine (a Firecracker VM, 16 vCPUs) disagree by 10-28% between trials even with
10-s trials and the garbage collector off (benchmarks/steady_probe.py), while their GPU phases stay fixed: the
host makes batches at a rate that drifts. This separates the host from perflab: one process and eight, each
unpinned and pinned one per core, six windows each; the spread is (max - min) / median of the windows' total
work, with the steal time /proc/stat reports over the same span.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

from benchmarks.common import cpu_ticks

WINDOW_S = 3.0
WINDOWS = 6


def _steal_and_total() -> tuple[int, int]:
    ticks = cpu_ticks()
    return ticks[7], sum(ticks)


def _spin(cpu: int | None, results: mp.Queue) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    rates = []
    for _ in range(WINDOWS):
        end, loops = time.perf_counter() + WINDOW_S, 0
        while time.perf_counter() < end:
            total = 0
            for i in range(20_000):
                total += i * i
            loops += 1
        rates.append(loops / WINDOW_S)
    results.put(rates)


def one_thread_per_core() -> list[int]:
    """The first CPU of each physical core, from lscpu's parseable output (all CPUs if it is missing)."""
    firsts, seen = [], set()
    for line in os.popen("lscpu -p=CPU,CORE 2>/dev/null").read().splitlines():
        if line and not line.startswith("#"):
            cpu, core = map(int, line.split(","))
            if core not in seen:
                seen.add(core)
                firsts.append(cpu)
    return firsts or sorted(os.sched_getaffinity(0))


def measure(processes: int, cpus: list[int] | None) -> str:
    results: mp.Queue = mp.Queue()
    steal_before = _steal_and_total()
    workers = [mp.Process(target=_spin, args=(None if cpus is None else cpus[i % len(cpus)], results))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    rates = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    steal_after = _steal_and_total()
    totals = [sum(r[window] for r in rates) for window in range(WINDOWS)]
    median = sorted(totals)[WINDOWS // 2]
    spread = (max(totals) - min(totals)) / median * 100
    steal = 100 * (steal_after[0] - steal_before[0]) / max(1, steal_after[1] - steal_before[1])
    pinned = "unpinned" if cpus is None else f"pinned to {cpus[:processes]}"
    return f"{processes} process(es) {pinned}: spread {spread:.1f}%, steal {steal:.2f}%, windows {[round(t) for t in totals]}"


def main() -> None:
    cores = one_thread_per_core()
    print(f"{os.cpu_count()} CPUs, {len(cores)} physical cores (first thread of each: {cores})", flush=True)
    for processes, cpus in [(1, None), (1, cores), (8, None), (8, cores)]:
        print(measure(processes, cpus), flush=True)


if __name__ == "__main__":
    main()

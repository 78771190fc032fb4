"""Why do loader-fed trials fall trial after trial? The DataLoader alone, timed in 3-s windows, several ways.

    python -m benchmarks.loader_drift --out DIR                  # about 4 minutes; CPU only (no GPU used)
    LOADER_DRIFT_ONLY=as-is,no-pin python -m benchmarks.loader_drift --out DIR

On the H100 machine, driving train bs32 with 8 workers ran 227, 221, 209, 201, 207 samples/s in five
consecutive trials, and augment with CPU augmentation 661 -> 593: a fall, while forward, backward and the copy
stayed fixed and only the data wait moved. This takes the model and the GPU out: each case iterates perflab's
own loader (step/data.make_loader) over the driving dataset at bs32 and drops the batches, for WINDOWS
windows after a warm-up, and records per window the batches made, the CPU time split /proc/stat reports
(user, system, softirq, steal), and /proc/meminfo's shared memory and free memory. A case that stays flat
where another falls names the cause:

- as-is: 8 workers, pinned memory (what perflab run does);
- no-pin: the same without pinned memory (no pin thread in the main process);
- file-system: tensors shared between processes through files instead of file descriptors;
- affinity: each worker pinned to its own core;
- in-process: the dataset's __getitem__ in this process, no workers (the host's own speed on the same work).

On the H100 machine (2026-11-23) every case swung 20-45% between windows, in-process included (29%), with user and
system CPU time level and steal under 3.5%: the host's rate on this memory-heavy work moves by itself.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from benchmarks.common import Rows, cpu_ticks, parse_args

WINDOW_S = 3.0
WINDOWS = 12
WARMUP_S = 4.0
WORKERS = 8
BATCH = 32
CASES = ("as-is", "no-pin", "file-system", "affinity", "in-process")


def _meminfo_mb(*keys: str) -> dict[str, float]:
    values = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, rest = line.split(":", 1)
            if name in keys:
                values[name] = int(rest.split()[0]) / 1024
    return values


def _pin_worker(worker_id: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[(worker_id + 1) % len(cores)]})


def _batches(case: str, dataset) -> Callable[[], object]:
    """A function that makes the next batch the case's way."""
    from perflab.step.data import loader_batches, make_loader
    if case == "in-process":
        from torch.utils.data import default_collate
        index = iter(range(10**9))
        return lambda: default_collate([dataset[next(index) % len(dataset)] for _ in range(BATCH)])
    loader = make_loader(dataset, BATCH, WORKERS, pin_memory=case != "no-pin", persistent_workers=True,
                         prefetch_factor=None, collate_fn=None, seed=0)
    if case == "affinity":
        loader.worker_init_fn = _pin_worker
    batches = loader_batches(loader)
    return lambda: next(batches)


def run_case(case: str, rows: Rows, windows: int = WINDOWS, window_s: float = WINDOW_S,
             warmup_s: float = WARMUP_S) -> None:
    from perflab.workloads.driving import CameraDataset
    torch.multiprocessing.set_sharing_strategy("file_system" if case == "file-system" else "file_descriptor")
    dataset = CameraDataset(size=1024, source_res=224 + 224 // 7, image_res=224, seed=0)
    next_batch = _batches(case, dataset)
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        next_batch()
    rates, notes = [], []
    for _ in range(windows):
        ticks, began, made = cpu_ticks(), time.perf_counter(), 0
        while time.perf_counter() - began < window_s:
            next_batch()
            made += 1
        took = time.perf_counter() - began
        spent = [after - before for before, after in zip(ticks, cpu_ticks())]
        total = sum(spent) or 1
        rates.append(made * BATCH / took)
        memory = _meminfo_mb("Shmem", "MemFree", "Cached")
        notes.append(f"{rates[-1]:.0f}/s usr {100 * spent[0] / total:.0f}% sys {100 * spent[2] / total:.0f}% "
                     f"softirq {100 * spent[6] / total:.0f}% steal {100 * spent[7] / total:.1f}% "
                     f"shmem {memory.get('Shmem', 0):.0f} MB free {memory.get('MemFree', 0):.0f} MB")
    median = statistics.median(rates)
    rows.add(case, "samples/s (median of windows)", round(median, 1), "samples/s",
             f"windows {[round(rate) for rate in rates]}")
    rows.add(case, "spread (range/median)", round(100 * (max(rates) - min(rates)) / median, 1), "%",
             f"first->last {100 * (rates[-1] - rates[0]) / rates[0]:+.1f}%")
    half = len(rates) // 2
    rows.add(case, "second half vs first half", round(100 * (statistics.mean(rates[half:]) /
                                                             statistics.mean(rates[:half]) - 1), 1), "%")
    for window, note in enumerate(notes):
        print(f"  [{case}] window {window}: {note}", flush=True)
    (rows.out / f"{case}.windows.txt").write_text("\n".join(notes) + "\n")


def main(cases: Optional[list[str]] = None) -> None:
    args = parse_args()
    rows = Rows("loader_drift", args.out)
    chosen = cases or [case for case in os.environ.get("LOADER_DRIFT_ONLY", ",".join(CASES)).split(",") if case]
    unknown = set(chosen) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}; known: {', '.join(CASES)}")
    timing = {"windows": 2, "window_s": 0.5, "warmup_s": 0.5} if args.quick else {}
    for case in chosen:
        run_case(case, rows, **timing)


if __name__ == "__main__":
    main()

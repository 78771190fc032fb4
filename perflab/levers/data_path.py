"""Data-path levers: DataLoader workers, persistent workers, prefetch factor, pinned memory, non_blocking."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import H2D_COPIES, INPUT_PIPELINE, NO_WORKERS, PAGEABLE_COPIES, WITH_WORKERS
from perflab.levers import LOADER_QUEUE, ONE_TRIAL, Address, Lever, TuneHints, first_refusal


def _needs_loader(what: str):
    def refusal(cfg, workload, device) -> Optional[str]:
        source = workload.default_data if cfg.data == "auto" else cfg.data
        if source == "device":
            return (f"{what} tunes the DataLoader, but {workload.name} runs on batches pre-staged on the "
                    "device; add --data loader to measure the loader")
        return None
    return refusal


def _needs_workers(what: str):
    def refusal(cfg, workload, device) -> Optional[str]:
        if cfg.workers == 0:
            return f"{what} only applies with DataLoader workers; add --workers N (N >= 1)"
        return None
    return refusal


TORCH_PREFETCH_DEFAULT = 2  # DataLoader's prefetch_factor when none is given
PREFETCH_FACTORS = (4, 8)  # the prefetch factors tune tries above the current one


def worker_ladder(cpu_count: int) -> tuple[int, ...]:
    """DataLoader worker counts tune climbs: 2, 4, 8, ... and last the CPU count itself (a loader-bound main process
    mostly waits for the workers): 2, 4, 8, 16 on 16 CPUs, 2, 4, 8, 12 on 12; 1 on one CPU."""
    if cpu_count <= 1:
        return (1,)
    rungs, workers = [], 2
    while workers < cpu_count:
        rungs.append(workers)
        workers *= 2
    return (*rungs, cpu_count)


def _prefetch_ladder(cpu_count: int) -> tuple[int, ...]:
    return PREFETCH_FACTORS


def _set_workers(plan, cfg) -> None:
    plan.workers = cfg.workers


def _set_persistent(plan, cfg) -> None:
    plan.persistent_workers = True


def _set_prefetch_factor(plan, cfg) -> None:
    plan.prefetch_factor = cfg.prefetch_factor


def _set_pin_memory(plan, cfg) -> None:
    plan.pin_memory = True


LEVERS = [
    Lever("workers", "workers", None, "load and transform batches in N DataLoader worker processes",
          "a DataLoader data source",
          # with no workers, more of them comes first; with some, the queue levers come before more of them
          (Address(INPUT_PIPELINE, 1, NO_WORKERS), Address(INPUT_PIPELINE, 3, WITH_WORKERS)), 10, _set_workers,
          in_code="DataLoader(..., num_workers=N)",
          when_lost="more DataLoader workers lost: the per-item work itself is the cost: cache decoded/pre-processed "
                    "items, or move the augmentation to the GPU in batches",
          tune=TuneHints(ONE_TRIAL, screen_always=5, ladder=worker_ladder), checks=_needs_loader("--workers"),
          changes_process=True),
    Lever("persistent-workers", "persistent_workers", True, "keep DataLoader workers alive between epochs",
          "--workers N", (Address(INPUT_PIPELINE, 2),), 11, _set_persistent,
          in_code="DataLoader(..., num_workers=N, persistent_workers=True)",
          when_lost="persistent workers lost: worker start-up is not the cost; the per-item work is: cache "
                    "decoded items or augment on the GPU",
          tune=TuneHints(ONE_TRIAL, data_path=LOADER_QUEUE),
          checks=first_refusal(_needs_loader("--persistent-workers"), _needs_workers("--persistent-workers")),
          changes_process=True),
    Lever("prefetch-factor", "prefetch_factor", None, "batches each worker loads ahead",
          "--workers N", (Address(INPUT_PIPELINE, 3, NO_WORKERS), Address(INPUT_PIPELINE, 1, WITH_WORKERS)), 12,
          _set_prefetch_factor,
          in_code="DataLoader(..., num_workers=N, prefetch_factor=4)",
          when_lost="a deeper prefetch queue lost: the loader is slower than the step on average, not just "
                    "bursty: make each item cheaper (cache, GPU augmentation)",
          tune=TuneHints(ONE_TRIAL, data_path=LOADER_QUEUE, ladder=_prefetch_ladder,
                         unset_means=TORCH_PREFETCH_DEFAULT),
          checks=first_refusal(_needs_loader("--prefetch-factor"), _needs_workers("--prefetch-factor")),
          changes_process=True),
    Lever("pin-memory", "pin_memory", True, "page-locked host batches: faster, asynchronous copies to the GPU "
          "(on by default on CUDA; --no-pin-memory turns it off)",
          "CUDA", (Address(H2D_COPIES, 1, PAGEABLE_COPIES),), 13, _set_pin_memory,
          in_code="DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
          when_lost="pinning lost (pinning in the main process costs what the pageable copy cost): the copy itself "
                    "is the cost: copy uint8 (or the smallest dtype that holds the data) and convert on the GPU, or "
                    "copy less per step",
          tune=TuneHints(ONE_TRIAL, data_path=LOADER_QUEUE), checks=_needs_loader("--pin-memory")),
]

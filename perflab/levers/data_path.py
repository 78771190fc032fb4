"""Data-path levers: DataLoader workers, persistent workers, prefetch factor, pinned memory, non_blocking."""
from __future__ import annotations

from typing import Optional

from perflab.levers import Lever, first_refusal

INPUT = ("input pipeline",)
COPIES = ("host-to-device copies",)


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
          "a DataLoader data source", INPUT, 10, _set_workers, _needs_loader("--workers")),
    Lever("persistent-workers", "persistent_workers", True, "keep DataLoader workers alive between epochs",
          "--workers N", INPUT, 11, _set_persistent,
          first_refusal(_needs_loader("--persistent-workers"), _needs_workers("--persistent-workers"))),
    Lever("prefetch-factor", "prefetch_factor", None, "batches each worker loads ahead",
          "--workers N", INPUT, 12, _set_prefetch_factor,
          first_refusal(_needs_loader("--prefetch-factor"), _needs_workers("--prefetch-factor"))),
    Lever("pin-memory", "pin_memory", True, "page-locked host batches: faster, asynchronous copies to the GPU "
          "(on by default on CUDA; --no-pin-memory turns it off)",
          "CUDA", COPIES, 13, _set_pin_memory, _needs_loader("--pin-memory")),
]

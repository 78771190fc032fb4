"""`perflab memory` as a library call: the breakdown, the fit, the batch search and the levers, saved as memory.json.

    study = memory_study(cfg, out, find_max_batch=True)

The breakdown is one step at cfg's batch (perflab/memory/step.py); the fit categorises one step at a quarter and a
half of that batch as well (smaller: they fit when it does) and predicts the peak from the categories that grow with
the batch (perflab/memory/fit.py), the line through the measured peaks kept beside it; the batch search runs each probe in its own process
(perflab/memory/search.py), starting from the fit's prediction; the levers come from the breakdown and the fit.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from perflab.config import RunConfig
from perflab.results.records import build
from perflab.errors import PerflabError
from perflab.memory.breakdown import MEMORY_FILE, Breakdown
from perflab.memory.fit import PeakFit, category_fit, fit_batches, fit_peaks
from perflab.memory.levers import LeverSaving, lever_savings
from perflab.memory.search import BatchSearch, Probe, batch_ceiling, find_largest_batch, probe_in_process
from perflab.memory.step import measure_step, memory_limit_mb
from perflab.results import read_json_object, write_json_atomic

SNAPSHOT_FILE = "memory_snapshot.pickle"
SEARCH_TOLERANCE = 0.02  # the bisection stops within 2% of the largest batch that fits
GROWTH_FROM_PREDICTION = 1.1  # from the fit's prediction the search grows gently; from no prediction it doubles
# the search starts a little under the prediction: the model leaves the workspace out, so it predicts a peak a few
# percent low (2-3% on an H100) and a largest batch a few percent high
START_UNDER_PREDICTION = 0.9


@dataclass
class MemoryStudy:
    breakdown: Breakdown
    fit: Optional[PeakFit]
    capacity_mb: Optional[float]
    levers: list[LeverSaving]
    search: Optional[BatchSearch] = None
    raw_fit: Optional[PeakFit] = None  # the line through max_memory_allocated: evidence beside the category model
    command: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def predicted_largest_batch(self) -> Optional[int]:
        return self.fit.largest_batch(self.capacity_mb) if self.fit is not None else None

    def to_dict(self) -> dict[str, Any]:
        search = self.search.to_dict() if self.search is not None else None
        if search is not None and self.fit is not None and self.search.largest_fits:
            search["predicted_peak_at_largest_mb"] = self.fit.predict_mb(self.search.largest_fits)
            if self.raw_fit is not None:
                search["raw_fit_peak_at_largest_mb"] = self.raw_fit.predict_mb(self.search.largest_fits)
        return {"kind": "memory", "command": self.command, "breakdown": self.breakdown.to_dict(),
                "fit": self.fit.to_dict() if self.fit is not None else None,
                "peak_model": self.fit.model if self.fit is not None else None,
                "raw_fit": self.raw_fit.to_dict() if self.raw_fit is not None else None, "capacity_mb": self.capacity_mb,
                "predicted_largest_batch": self.predicted_largest_batch, "search": search,
                "levers": [lever.to_dict() for lever in self.levers], "files": self.files}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MemoryStudy":
        """memory.json read back: keys an older file lacks take their defaults; the derived figures (the predicted
        largest batch, the search's predicted peak) are recomputed, not read."""
        return build(cls, data)


def capacity_mb(breakdown: Breakdown, limit_mb: Optional[float]) -> Optional[float]:
    """What the peak may reach: the memory limit, else the device's memory less the allocator's slack; None on a
    CPU without a limit."""
    if limit_mb is not None:
        return limit_mb
    if breakdown.total_mb is None:
        return None
    return breakdown.total_mb - (breakdown.slack_mb or 0.0) - _other_processes_mb(breakdown)


def _other_processes_mb(breakdown: Breakdown) -> float:
    """Device memory this process's allocator does not hold (CUDA context, other processes)."""
    if not breakdown.device.startswith("cuda"):
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return max(0.0, (total - free) / 2**20 - torch.cuda.memory_reserved() / 2**20)


def memory_study(cfg: RunConfig, out: Path, find_max_batch: bool = False, limit_mb: Optional[float] = None,
                 shards: int = 8, checkpointing_supported: Optional[bool] = None, command: Optional[list[str]] = None,
                 tolerance: float = SEARCH_TOLERANCE, dataset_items: Optional[int] = None,
                 note: Callable[[str], None] = lambda text: None,
                 on_probe: Callable[[Probe], None] = lambda probe: None) -> MemoryStudy:
    """Break one step's memory down, fit the peak over batch, optionally find the largest batch (no larger than
    `dataset_items`, the dataset's length when its items are not repeated); save memory.json."""
    limit_mb = memory_limit_mb(limit_mb)
    out.mkdir(parents=True, exist_ok=True)
    on_cuda = cfg.device == "cuda"
    note(f"one step at batch {cfg.batch_size}, profiled for memory")
    breakdown = measure_step(cfg, snapshot=out / SNAPSHOT_FILE if on_cuda else None, limit_mb=limit_mb)
    files = {"snapshot": SNAPSHOT_FILE} if (out / SNAPSHOT_FILE).is_file() else {}
    steps = {cfg.batch_size: breakdown}
    for batch in fit_batches(cfg.batch_size):
        if batch not in steps:
            note(f"the peak at batch {batch}, categorised, for the fit")
            try:
                steps[batch] = measure_step(cfg.replace(batch_size=batch), count_autocast=False)
            except PerflabError as err:  # e.g. BatchNorm refuses a batch this small: fit on the others
                breakdown.notes.append(f"no fit point at batch {batch}: {str(err).splitlines()[0]}")
    raw_fit = fit_peaks(list(steps), [step.peak_mb for step in steps.values()]) if len(steps) >= 2 else None
    fit = category_fit(list(steps.values()))
    unattributed = breakdown.unattributed_mb
    if unattributed > 0.1 * breakdown.peak_mb:
        breakdown.notes.append(f"{unattributed:,.0f} MiB of the peak at batch {cfg.batch_size} is outside the categories "
                               "(cuDNN/cuBLAS workspace, allocator rounding): the peak model leaves it out")
    capacity = capacity_mb(breakdown, limit_mb)
    study = MemoryStudy(breakdown, fit, capacity, lever_savings(breakdown, fit, capacity, shards,
                                                                checkpointing_supported), command=command or [],
                        files=files, raw_fit=raw_fit)
    if find_max_batch:
        study.search = _search_largest_batch(cfg, study.predicted_largest_batch, limit_mb, tolerance, dataset_items,
                                             note, on_probe)
    write_json_atomic(out / MEMORY_FILE, study.to_dict())
    return study


def _search_largest_batch(cfg: RunConfig, predicted: Optional[int], limit_mb: Optional[float], tolerance: float,
                          dataset_items: Optional[int], note: Callable[[str], None],
                          on_probe: Callable[[Probe], None]) -> BatchSearch:
    """The batch search from the fit's prediction (or twice the batch), each probe its own process."""
    ceiling = batch_ceiling(dataset_items)
    start = int(START_UNDER_PREDICTION * predicted) if predicted and predicted > cfg.batch_size else cfg.batch_size * 2
    start = min(max(start, cfg.batch_size + 1), ceiling.batch)
    note(f"the largest batch: each probe in its own process, from batch {start} (at most {ceiling.reason})")
    _release_cached_memory()  # the probes' processes need the device memory this one cached
    return find_largest_batch(lambda batch: probe_in_process(cfg, batch, limit_mb), start, known_fits=cfg.batch_size,
                              growth=GROWTH_FROM_PREDICTION if predicted else 2.0, tolerance=tolerance,
                              ceiling=ceiling, on_probe=on_probe)


def _release_cached_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def load_study(directory: Path) -> MemoryStudy:
    """memory.json in `directory`, typed."""
    return MemoryStudy.from_dict(read_json_object(Path(directory) / MEMORY_FILE, "a perflab memory study",
                                                  "re-run perflab memory"))

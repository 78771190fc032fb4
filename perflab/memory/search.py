"""The largest batch that fits, found out-of-memory-safely: each probe is its own `perflab memory --probe` process.

Grow, then bisect (Lightning's BatchSizeFinder does the same): from a batch known to fit (or the fit's
prediction), multiply until a probe runs out of memory, then halve the gap until it is within `tolerance` of the
largest that fits. A probe that crashes in any other way stops the search with its message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from perflab.config import RunConfig
from perflab.errors import EXIT_OUT_OF_MEMORY, PerflabError

MAX_PROBES = 14
PROBE_TIMEOUT_S = 300
MAX_SEARCH_BATCH = 1 << 24  # only stops a growth that never runs out of memory (no limit, a huge --memory-limit-mb)


@dataclass
class Probe:
    batch: int
    status: str  # ok | oom
    peak_mb: Optional[float] = None
    message: str = ""


@dataclass
class BatchSearch:
    """The probes in the order they ran, the largest batch that fitted and the smallest that did not."""

    probes: list[Probe] = field(default_factory=list)
    largest_fits: Optional[int] = None
    smallest_oom: Optional[int] = None
    limited_by: Optional[str] = None  # what stopped the search before memory did, e.g. "the dataset, 4096 items"

    @property
    def largest_peak_mb(self) -> Optional[float]:
        return next((p.peak_mb for p in self.probes if p.batch == self.largest_fits and p.status == "ok"), None)

    def to_dict(self) -> dict:
        return {"probes": [asdict(p) for p in self.probes], "largest_fits": self.largest_fits,
                "smallest_oom": self.smallest_oom, "largest_peak_mb": self.largest_peak_mb,
                "limited_by": self.limited_by}


def search_bound(limited_by: Optional[str], smallest_oom: Optional[int]) -> str:
    """What bounds the answer, as the CLI and the report say it."""
    if limited_by:
        return f"limited by {limited_by}, not by memory"
    return f"smallest that did not: {smallest_oom or '—'}"


@dataclass(frozen=True)
class BatchCeiling:
    """The largest batch the search may probe, and what sets it (the answer when that batch still fits)."""

    batch: int = MAX_SEARCH_BATCH
    reason: str = f"the search's cap, batch {MAX_SEARCH_BATCH:,}"


def batch_ceiling(dataset_items: Optional[int]) -> BatchCeiling:
    """The dataset's length bounds the batch (a batch larger than the dataset is refused), else the search's cap."""
    if dataset_items is not None and dataset_items < MAX_SEARCH_BATCH:
        return BatchCeiling(dataset_items, f"the dataset, {dataset_items:,} items")
    return BatchCeiling()


def probe_in_process(cfg: RunConfig, batch: int, limit_mb: Optional[float]) -> Probe:
    """Run `perflab memory --probe` at `batch` in a fresh process; its peak, or that it ran out of memory."""
    with tempfile.TemporaryDirectory(prefix="perflab-probe-") as folder:
        answer = Path(folder) / "probe.json"
        command = [sys.executable, "-m", "perflab", "memory", *cfg.replace(batch_size=batch).to_argv("run"),
                   "--probe", str(answer)]
        if limit_mb is not None:
            command += ["--memory-limit-mb", str(limit_mb)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_perflab_root(),
                                                                         os.environ.get("PYTHONPATH")]))}
        finished = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env,
                                  stdin=subprocess.DEVNULL)
        if finished.returncode == EXIT_OUT_OF_MEMORY:
            lines = [line for line in finished.stderr.splitlines() if "out of memory" in line]
            return Probe(batch, "oom", message=lines[0].strip() if lines else "out of memory")
        if finished.returncode != 0 or not answer.is_file():
            tail = "\n".join((finished.stderr or finished.stdout).strip().splitlines()[-3:])
            raise PerflabError(f"the memory probe at batch {batch} failed (exit {finished.returncode}): {tail}")
        return Probe(batch, "ok", peak_mb=json.loads(answer.read_text())["peak_mb"])


def _perflab_root() -> str:
    return str(Path(__file__).resolve().parents[2])  # the tree this perflab runs from, for the child's imports


def find_largest_batch(run_probe: Callable[[int], Probe], start: int, known_fits: Optional[int] = None,
                       growth: float = 2.0, tolerance: float = 0.0, ceiling: BatchCeiling = BatchCeiling(),
                       on_probe: Callable[[Probe], None] = lambda probe: None) -> BatchSearch:
    """Grow from `start` by `growth` until a probe runs out of memory, then bisect; `tolerance` (a share of the
    largest fit) stops the bisection early. `known_fits` is a batch already known to fit. No probe goes past
    `ceiling`: when its batch fits, the search stops there and says what limited it (on the H100 a cap of 65,536
    ended an MLP's search at its first probe, so the cap only stops a growth that never runs out of memory)."""
    search = BatchSearch(largest_fits=known_fits)
    max_batch = ceiling.batch
    if known_fits is not None and known_fits >= max_batch:
        search.limited_by = ceiling.reason
        return search
    batch = min(max(1, start), max_batch)

    def record(probe: Probe) -> None:
        search.probes.append(probe)
        on_probe(probe)
        if probe.status == "ok":
            search.largest_fits = max(search.largest_fits or 0, probe.batch)
        else:
            search.smallest_oom = min(search.smallest_oom or probe.batch, probe.batch)

    while len(search.probes) < MAX_PROBES:
        record(run_probe(batch))
        if search.smallest_oom is None:
            if batch >= max_batch:
                search.limited_by = ceiling.reason
                break
            batch = min(max_batch, max(batch + 1, int(batch * growth)))
            continue
        low = search.largest_fits or 0
        high = search.smallest_oom
        if high - low <= max(1, int(tolerance * low)):
            break
        batch = (low + high) // 2
    return search

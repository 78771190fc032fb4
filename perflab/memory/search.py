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

    @property
    def largest_peak_mb(self) -> Optional[float]:
        return next((p.peak_mb for p in self.probes if p.batch == self.largest_fits and p.status == "ok"), None)

    def to_dict(self) -> dict:
        return {"probes": [asdict(p) for p in self.probes], "largest_fits": self.largest_fits,
                "smallest_oom": self.smallest_oom, "largest_peak_mb": self.largest_peak_mb}


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
                       growth: float = 2.0, tolerance: float = 0.0, max_batch: int = 1 << 24,
                       on_probe: Callable[[Probe], None] = lambda probe: None) -> BatchSearch:
    """Grow from `start` by `growth` until a probe runs out of memory, then bisect; `tolerance` (a share of the
    largest fit) stops the bisection early. `known_fits` is a batch already known to fit. `max_batch` only stops a
    growth that never runs out of memory (on the H100 a cap of 65,536 ended an MLP's search at its first probe)."""
    search = BatchSearch(largest_fits=known_fits)
    batch = max(1, start)

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
                break
            batch = min(max_batch, max(batch + 1, int(batch * growth)))
            continue
        low = search.largest_fits or 0
        high = search.smallest_oom
        if high - low <= max(1, int(tolerance * low)):
            break
        batch = (low + high) // 2
    return search

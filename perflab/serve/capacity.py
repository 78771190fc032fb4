"""The harness's own capacity: how fast the load generator issues queries and the batcher and instance threads
move them when the model takes no time (or a fixed time), so results can show they were not the bottleneck."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from perflab.serve.loadgen import run_offline, run_scheduled
from perflab.serve.server import Server

PROBE_QUERIES = 4000


class FixedTimeEngine:
    """A stand-in model: every batch takes `seconds_per_batch` (0: a no-op), whatever its size."""

    def __init__(self, seconds_per_batch: float = 0.0):
        self.seconds_per_batch = seconds_per_batch

    def warm_up(self, rounds: int) -> None:
        pass

    def serve(self, sample_ids: np.ndarray) -> tuple[float, float]:
        if self.seconds_per_batch > 0:
            time.sleep(self.seconds_per_batch)
        return 0.0, 0.0


def measure_capacity(max_batch: int, timeout_s: float, instances: int, queries: int = PROBE_QUERIES) -> dict[str, Any]:
    """Queries/s the load generator can issue, and queries/s the batcher and instances sustain with a no-op
    model (at --max-batch, and one query per batch)."""
    server = Server([FixedTimeEngine() for _ in range(instances)])
    samples = np.zeros(queries, dtype=int)
    try:
        # Every arrival scheduled at once: the generator issues as fast as it can, so its rate is its ceiling.
        burst = run_scheduled(server, np.zeros(queries), samples, max_batch, timeout_s)
        issue_span_s = float(np.nanmax(burst.issued_s) - np.nanmin(burst.issued_s))
        full = run_offline(server, queries, samples, max_batch, timeout_s)
        single = run_offline(server, queries // 4, samples, 1, 0.0)
    finally:
        server.close()
    return {
        "loadgen_issue_qps": queries / issue_span_s if issue_span_s > 0 else float("inf"),
        "batcher_qps_at_max_batch": _rate(full),
        "batcher_batches_per_s": _rate(single),
        "probe_queries": queries,
        "model": "no-op (FixedTimeEngine(0))",
    }


def _rate(log) -> float:
    span_s = float(np.nanmax(log.done_s))
    return len(log) / span_s if span_s > 0 else float("inf")

"""The harness's own capacity: how fast the batcher and instance threads move queries when the model takes no time,
and how late the batcher dispatches on a fast Poisson schedule, so results can show the harness was not the
bottleneck. Measured through the same path as the points (ScheduledBatcher, Server, QueryLog)."""
from __future__ import annotations

import time
import numpy as np

from perflab.results.metrics import Capacity
from perflab.serve.loadgen import run_offline, run_scheduled
from perflab.serve.metrics import QueryLog, dispatch_lateness
from perflab.serve.schedule import poisson_arrivals
from perflab.serve.server import Server

PROBE_QUERIES = 4000
PROBE_RATE_QPS = 20_000.0  # the fast schedule's rate: well past what the points offer on a CPU
PROBE_SEED = 0


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


def measure_capacity(max_batch: int, timeout_s: float, instances: int, queries: int = PROBE_QUERIES) -> Capacity:
    """With a no-op model: queries/s the batcher and instances move at --batcher-max-batch (every query arrived at once),
    batches/s at one query per batch, and the batcher's dispatch delay on a Poisson schedule at PROBE_RATE_QPS."""
    server = Server([FixedTimeEngine() for _ in range(instances)])
    samples = np.zeros(queries, dtype=int)
    arrivals = poisson_arrivals(PROBE_RATE_QPS, queries / PROBE_RATE_QPS, queries, PROBE_SEED)[:queries]
    try:
        full = run_offline(server, queries, samples, max_batch, timeout_s)
        single = run_offline(server, queries // 4, samples, 1, 0.0)
        fast = run_scheduled(server, arrivals, samples, max_batch, timeout_s)
    finally:
        server.close()
    late = dispatch_lateness(fast)
    return Capacity(batcher_qps_at_max_batch=_rate(full), batcher_batches_per_s=_rate(single),
                    dispatch_probe_qps=PROBE_RATE_QPS, dispatch_delay_p99_ms=late.p99_ms,
                    dispatch_delay_max_ms=late.max_ms, probe_queries=queries, model="no-op (FixedTimeEngine(0))")


def _rate(log: QueryLog) -> float:
    span_s = float(np.nanmax(log.done_s))
    return len(log) / span_s if span_s > 0 else float("inf")

"""Per-query timestamps, and what they add up to: latency percentiles, where a query's time goes (on average and
in the tail), achieved vs offered rate, batch fill, and the cost of a million queries."""
from __future__ import annotations

import threading
from typing import Any, Optional

import numpy as np

from perflab.cost import cost_per_million
from perflab.generation.metrics import RequestTiming
from perflab.serve.batcher import FormedBatch
from perflab.generation.metrics import summarize_requests
from perflab.results.metrics import DispatchDelay, LoadPoint, Overload
from perflab.serve.validity import nearest_rank

PERCENTILES = (50, 90, 95, 99, 99.9)
# A query's life, in order; the parts add up to its latency (done - scheduled). Every reader (tables, report,
# plots, diagnosis) takes the parts from here.
COMPONENTS = ("queue_wait", "batch_formation", "dispatch_delay", "copy_in", "compute", "copy_out")
TAIL_PERCENTILE = 99.0


class QueryLog:
    """Host-clock timestamps (seconds from the start of the point) of every query, filled as queries move on."""

    def __init__(self, scheduled_s: np.ndarray):
        count = len(scheduled_s)
        self.scheduled_s = np.asarray(scheduled_s, dtype=float)  # its arrival (single-stream: when it was issued)
        self.formation_s = np.full(count, np.nan)  # when an instance began forming its batch (or it arrived)
        self.due_s = np.full(count, np.nan)  # when its batch was due (or it arrived, if later)
        self.dispatched_s = np.full(count, np.nan)
        self.copied_in_s = np.full(count, np.nan)
        self.computed_s = np.full(count, np.nan)
        self.done_s = np.full(count, np.nan)
        self.batch_size = np.zeros(count, dtype=int)
        self.batch_sizes: list[int] = []  # one entry per batch, in dispatch order
        self.dispatch_delays_s: list[float] = []  # per batch: due -> dispatched (sleep overshoot, GIL waits)
        self.busy_s = 0.0  # instance time spent on batches (copy in, compute, copy out), summed over instances
        # generation: per batch, (query ids, its token times, host time its last token came out)
        self.token_batches: list[tuple[list[int], RequestTiming, float]] = []
        self._lock = threading.Lock()  # instances record from their own threads
        self.overloaded: Optional[Overload] = None  # set when the point stopped at the queue's bound

    def __len__(self) -> int:
        return len(self.scheduled_s)

    def truncated(self, count: int) -> "QueryLog":
        """The first `count` queries (a log allocated for more queries than were issued)."""
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                setattr(self, name, value[:count])
        return self

    def query_requests(self) -> list[RequestTiming]:
        """Every generated query's token times, in ms from its scheduled arrival (TTFT includes the queue)."""
        return [timing for ids, request, last_token_s in self.token_batches
                for timing in per_query_requests(ids, request, last_token_s, self.scheduled_s)]

    def record_batch(self, batch: FormedBatch, copied_in_s: float, computed_s: float, done_s: float) -> None:
        """Stamp every query of one batch (called by the instance that served it)."""
        with self._lock:
            self._record(batch, copied_in_s, computed_s, done_s)

    def record_tokens(self, ids: list[int], request: RequestTiming, last_token_s: float) -> None:
        """Keep one generated batch's token times."""
        with self._lock:
            self.token_batches.append((list(ids), request, last_token_s))

    def _record(self, batch: FormedBatch, copied_in_s: float, computed_s: float, done_s: float) -> None:
        index = np.asarray(batch.query_ids)
        self.formation_s[index] = np.maximum(self.scheduled_s[index], batch.opened_s)
        # A query that arrived after its batch was due, but before it was dispatched, rode along: from its
        # arrival to the dispatch is dispatch delay, and it spent no time forming.
        self.due_s[index] = np.maximum(self.formation_s[index], batch.due_s)
        self.dispatched_s[index] = batch.dispatched_s
        self.copied_in_s[index] = copied_in_s
        self.computed_s[index] = computed_s
        self.done_s[index] = done_s
        self.batch_size[index] = len(index)
        self.batch_sizes.append(len(index))
        self.dispatch_delays_s.append(batch.dispatched_s - batch.due_s)
        self.busy_s += done_s - batch.dispatched_s

    @property
    def completed(self) -> np.ndarray:
        return ~np.isnan(self.done_s)

    def components_ms(self) -> dict[str, np.ndarray]:
        """Each query's time in each part of its life, in ms (completed queries only)."""
        done = self.completed
        stamps = [self.scheduled_s, self.formation_s, self.due_s, self.dispatched_s, self.copied_in_s,
                  self.computed_s, self.done_s]
        return {name: 1000 * (stamps[i + 1][done] - stamps[i][done]) for i, name in enumerate(COMPONENTS)}

    def latency_ms(self) -> np.ndarray:
        done = self.completed
        return 1000 * (self.done_s[done] - self.scheduled_s[done])


def per_query_requests(ids: Any, request: RequestTiming, last_token_s: float, scheduled_s: np.ndarray
                       ) -> list[RequestTiming]:
    """The batch's token times as each of its queries saw them: ms from the query's scheduled arrival (so TTFT
    includes the queue wait), anchored where the last token came out (`last_token_s`, host clock)."""
    emitted_s = [last_token_s - (request.emitted_ms[-1] - ms) / 1000 for ms in request.emitted_ms]
    return [RequestTiming(1, request.prompt_len, [1000 * (s - scheduled_s[query]) for s in emitted_s],
                          list(request.counts)) for query in ids]


def latency_percentiles(latency_ms: np.ndarray) -> dict[str, float]:
    """Nearest-rank p50, p90, p95, p99 and p99.9 (keys p50 ... p99.9), mean and max: the p99 shown is the one the
    point is judged by, one real query's latency."""
    # Not perflab.stats.percentiles: its keys drop decimals (p99.9 would overwrite p99), and it interpolates.
    found = {f"p{p:g}": nearest_rank(latency_ms, p) for p in PERCENTILES}
    found.update(mean=float(np.mean(latency_ms)) if latency_ms.size else float("nan"),
                 max=float(np.max(latency_ms)) if latency_ms.size else float("nan"))
    return found


def where_time_goes(log: QueryLog) -> dict[str, dict[str, float]]:
    """Mean ms per component over all queries, and over the tail (queries at or past the p99 latency)."""
    parts = log.components_ms()
    latency = log.latency_ms()
    if latency.size == 0:
        return {"mean": {}, "tail": {}}
    tail = latency >= nearest_rank(latency, TAIL_PERCENTILE)
    return {"mean": {name: float(values.mean()) for name, values in parts.items()},
            "tail": {name: float(values[tail].mean()) for name, values in parts.items()}}


def dispatch_lateness(log: QueryLog) -> DispatchDelay:
    """How late the batcher dispatched its batches against when they were due (p99 and max over batches, ms):
    the harness's own lateness (sleep overshoot, waits for the GIL), which counts against the point's latency."""
    late_ms = 1000 * np.asarray(log.dispatch_delays_s)
    if late_ms.size == 0:
        return DispatchDelay(p99_ms=float("nan"), max_ms=float("nan"))
    return DispatchDelay(p99_ms=float(np.percentile(late_ms, 99)), max_ms=float(late_ms.max()))


def realised_rate(scheduled_s: np.ndarray) -> float:
    """The rate a Poisson schedule really offered: queries after the first over the time to the last arrival (a
    seeded draw offers a little more or less than its nominal rate)."""
    span_s = float(np.max(scheduled_s) - np.min(scheduled_s)) if len(scheduled_s) > 1 else 0.0
    return (len(scheduled_s) - 1) / span_s if span_s > 0 else float("nan")


def summarize_tokens(log: QueryLog, span_s: float, slo: dict[str, float]) -> dict[str, Any]:
    """TTFT (from the scheduled arrival), TPOT, ITL, output tokens/s and goodput of a point's generated queries,
    as perflab run reports them (perflab.generation.metrics), over the point's span."""
    requests = log.query_requests()
    summary = summarize_requests(requests, [(len(requests), span_s)], None, slo)
    summary["ttft_from"] = "scheduled arrival (queue wait included)"
    return summary


def summarize_point(log: QueryLog, scenario: str, offered_qps: Optional[float], max_batch: int, instances: int,
                    late_ms: float, gpu: Optional[dict] = None, cost_per_hour: Optional[float] = None) -> LoadPoint:
    """Everything one point measured, as result.json keeps it."""
    latency = log.latency_ms()
    done = log.completed
    first, last = float(np.nanmin(log.scheduled_s)), float(np.nanmax(log.done_s)) if done.any() else float("nan")
    span_s = last - first
    achieved = float(done.sum() / span_s) if span_s > 0 else float("nan")
    sizes = np.asarray(log.batch_sizes)
    histogram = {int(size): int(count) for size, count in zip(*np.unique(sizes, return_counts=True))}
    late = dispatch_lateness(log)
    return LoadPoint(
        scenario=scenario,
        offered_qps=offered_qps,
        realised_offered_qps=realised_rate(log.scheduled_s) if scenario == "server" else None,
        achieved_qps=achieved,
        queries=int(len(log)),
        completed=int(done.sum()),
        duration_s=span_s,
        latency_ms=latency_percentiles(latency),
        time_ms=where_time_goes(log),
        batches=int(sizes.size),
        batch_histogram=histogram,
        batch_mean=float(sizes.mean()) if sizes.size else 0.0,
        batch_fill_pct=float(100 * sizes.mean() / max_batch) if sizes.size else 0.0,
        instance_busy_pct=float(100 * log.busy_s / (instances * span_s)) if span_s > 0 else float("nan"),
        dispatch_delay_ms=late,
        harness_late=bool(late.p99_ms > late_ms),  # the point measured the harness too: not valid
        gpu=gpu,
        cost_per_million_queries=cost_per_million(cost_per_hour, achieved),
    )

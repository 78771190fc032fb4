"""The load generator: issues queries on the scenario's schedule, stamps when each was really issued (so a
generator that falls behind its schedule is seen), and waits for the instances to drain the batcher.

Latency is measured from the scheduled arrival, as LoadGen does: a late issue counts against the system
(as 'issue_delay') rather than hiding a queue that the generator failed to build."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

import numpy as np

from perflab.serve.batcher import Batcher
from perflab.serve.metrics import QueryLog
from perflab.serve.server import Server

SWITCH_INTERVAL_S = 0.0005  # how often Python may hand the GIL to another thread while serving
WAIT_POLL_S = 0.5
SINGLE_STREAM_CAP = 200_000  # single-stream queries per point at most (a no-op model could issue millions)


@contextlib.contextmanager
def prompt_thread_switches() -> Iterator[None]:
    """Shorten the GIL switch interval (5 ms by default): the generator thread wakes on time even while an
    instance thread runs Python (kernel launches), instead of waiting for the interval to expire."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _point_clock() -> Callable[[], float]:
    """Seconds since the point began: the clock every stamp of the point is taken on."""
    began = time.perf_counter()
    return lambda: time.perf_counter() - began


def run_scheduled(server: Server, arrivals_s: np.ndarray, samples: np.ndarray, max_batch: int,
                  timeout_s: float) -> QueryLog:
    """Server scenario: issue query i at arrivals_s[i] (seconds from the start); returns every query's stamps."""
    clock = _point_clock()
    batcher = Batcher(max_batch, timeout_s, clock)
    log = QueryLog(arrivals_s)
    with prompt_thread_switches():
        serving = server.start(batcher, log, samples)
        try:
            for query_id, scheduled_s in enumerate(arrivals_s):
                delay = scheduled_s - clock()
                if delay > 0:
                    time.sleep(delay)
                issued_s = clock()
                log.issued_s[query_id] = issued_s
                batcher.put((query_id,), issued_s)
        finally:
            batcher.close()
        serving.wait()
    return log


def run_offline(server: Server, queries: int, samples: np.ndarray, max_batch: int, timeout_s: float) -> QueryLog:
    """Offline scenario: every query is issued at once; the instances take full batches as fast as they can."""
    clock = _point_clock()
    batcher = Batcher(max_batch, timeout_s, clock)
    log = QueryLog(np.zeros(queries))
    with prompt_thread_switches():
        serving = server.start(batcher, log, samples)
        issued_s = clock()
        log.issued_s[:] = issued_s
        batcher.put(range(queries), issued_s)
        batcher.close()
        serving.wait()
    return log


def run_single_stream(server: Server, duration_s: float, min_queries: int, samples: np.ndarray) -> QueryLog:
    """Single-stream scenario: the next query is issued the moment the previous one completes, until both the
    duration and the query count are met."""
    clock = _point_clock()
    batcher = Batcher(1, 0.0, clock)
    log = QueryLog(np.full(SINGLE_STREAM_CAP, np.nan))
    completed = threading.Event()
    issued = 0
    with prompt_thread_switches():
        serving = server.start(batcher, log, np.resize(samples, SINGLE_STREAM_CAP),
                               on_done=lambda ids: completed.set())
        try:
            while issued < SINGLE_STREAM_CAP and (issued < min_queries or clock() < duration_s):
                completed.clear()
                now = clock()
                log.scheduled_s[issued] = log.issued_s[issued] = now
                batcher.put((issued,), now)
                issued += 1
                while not completed.wait(WAIT_POLL_S):
                    if serving.stopped():  # an instance failed; wait() below raises its error
                        break
        finally:
            batcher.close()
        serving.wait()
    return log.truncated(issued)

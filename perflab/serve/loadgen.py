"""The scenarios' load: server and offline read their arrivals off a known schedule (virtual arrivals: the
ScheduledBatcher takes a query once the point's clock passes its arrival, no thread issues it); single-stream issues
the next query as each completes. Each returns every query's stamps.

Latency is measured from the scheduled arrival, as LoadGen does: a batch dispatched late counts against the system
(as 'dispatch_delay') rather than hiding a queue that the harness failed to build."""
from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from typing import Callable, Iterator

import numpy as np

from perflab.serve.batcher import Batcher, ScheduledBatcher
from perflab.serve.metrics import QueryLog
from perflab.serve.server import Server

SWITCH_INTERVAL_S = 0.0005  # how often Python may hand the GIL to another thread while serving
WAIT_POLL_S = 0.5
SINGLE_STREAM_CAP = 200_000  # single-stream queries per point at most (a no-op model could issue millions)


@contextlib.contextmanager
def prompt_thread_switches() -> Iterator[None]:
    """Shorten the GIL switch interval (5 ms by default). No thread issues queries any more, but the instance that
    forms the next batch sleeps until it is due and must then take the GIL from instances running Python (kernel
    launches, compiled graphs' guards): with the default interval its dispatch could wait up to 5 ms."""
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
                  timeout_s: float, max_wait_s: float = math.inf) -> QueryLog:
    """Server scenario: query i arrives at arrivals_s[i] (seconds from the start, sorted); returns every query's
    stamps once the instances have served the whole schedule, or once a query has waited `max_wait_s` (then
    `log.overloaded` says so and the rest of the schedule is left unserved)."""
    clock = _point_clock()
    batcher = ScheduledBatcher(arrivals_s, max_batch, timeout_s, clock, max_wait_s)
    log = QueryLog(arrivals_s)
    with prompt_thread_switches():
        serving = server.start(batcher, log, samples)
        try:
            serving.wait()
        finally:
            batcher.close()  # interrupted (Ctrl-C): the instances stop taking batches
    log.overloaded = batcher.overloaded
    return log


def run_offline(server: Server, queries: int, samples: np.ndarray, max_batch: int, timeout_s: float) -> QueryLog:
    """Offline scenario: every query arrives at 0; the instances take full batches as fast as they can."""
    return run_scheduled(server, np.zeros(queries), samples, max_batch, timeout_s)


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
                log.scheduled_s[issued] = now
                batcher.put((issued,), now)
                issued += 1
                while not completed.wait(WAIT_POLL_S):
                    if serving.stopped():  # an instance failed; wait() below raises its error
                        break
        finally:
            batcher.close()
        serving.wait()
    return log.truncated(issued)

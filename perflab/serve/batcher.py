"""The dynamic batcher: a free instance takes a batch when --batcher-max-batch queries wait, or when the oldest waiting query
has waited --batch-timeout-ms (Triton's max_queue_delay). One instance forms a batch at a time.

Two batchers share that policy and one interface (`next_batch()`, `clock`):
- ScheduledBatcher (server, offline): the arrivals are known in advance, so no thread issues queries; a query
  exists once the point's clock passes its scheduled arrival, and the forming instance sleeps (releasing the GIL)
  until the batch is due. A per-query issuing thread in the instances' interpreter competed with them for the GIL
  and fell behind its schedule (at 1.2k queries/s on an H100).
- Batcher (single-stream): queries are put as they are issued, because each arrival depends on a completion."""
from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from perflab.results.metrics import Overload


@dataclass
class FormedBatch:
    """The queries of one batch: `opened_s` when an instance began forming it, `due_s` when the policy closed it
    (full, timed out, or nothing more to wait for; never before `opened_s`), `dispatched_s` when it was handed over."""

    query_ids: list[int]
    opened_s: float
    due_s: float
    dispatched_s: float


class BatchSource(Protocol):
    """What Server.start serves from: batches until None, stamped on `clock` (seconds from the point's start)."""

    clock: Callable[[], float]

    def next_batch(self) -> Optional[FormedBatch]:
        """Block until the next batch is due and return it; None when there are no more."""


def due_time(first_arrival_s: float, filling_arrival_s: float, timeout_s: float, opened_s: float) -> float:
    """When a batch closes: when the query that fills it arrives, or the oldest has waited `timeout_s`, whichever
    comes first; never before an instance began forming it (an earlier due time was spent queueing)."""
    return max(min(filling_arrival_s, first_arrival_s + timeout_s), opened_s)


class ScheduledBatcher:
    """Batches read off a known arrival schedule (sorted seconds from the point's start; query i arrives at
    `arrivals_s[i]`): the forming instance sleeps until the batch is due, then takes every query that has arrived."""

    def __init__(self, arrivals_s: np.ndarray, max_batch: int, timeout_s: float,
                 clock: Callable[[], float] = time.perf_counter, max_wait_s: float = math.inf):
        self.arrivals_s = np.asarray(arrivals_s, dtype=float)
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.clock = clock
        # The queue's bound: once the oldest waiting query has waited this long the point stops (overloaded), and
        # the rest of the schedule is never served.
        self.max_wait_s = max_wait_s
        self.overloaded: Optional[Overload] = None
        self._taken = 0  # queries before this one are in batches already
        self._forming = threading.Lock()  # one instance forms a batch at a time; the others queue behind it
        self._stopped = threading.Event()  # set by close(): wakes a sleeping instance (Ctrl-C)

    def close(self) -> None:
        """Stop handing out batches (an interrupted point): a sleeping instance wakes and gets None."""
        self._stopped.set()

    def _sleep_until(self, at_s: float) -> None:
        # Event.wait releases the GIL, like time.sleep, but close() can cut it short; loop in case it wakes early.
        while (delay := at_s - self.clock()) > 0 and not self._stopped.wait(delay):
            pass

    def next_batch(self) -> Optional[FormedBatch]:
        """Sleep until the next query arrives, then until its batch is due; take the queries that have arrived by
        then (at most --batcher-max-batch, at least that first one)."""
        with self._forming:
            first, count = self._taken, len(self.arrivals_s)
            if first >= count or self._stopped.is_set():
                return None
            opened_s = self.clock()
            if opened_s - self.arrivals_s[first] > self.max_wait_s:
                waiting = int(np.searchsorted(self.arrivals_s, opened_s, side="right")) - first
                self.overloaded = Overload(at_s=opened_s, waited_s=opened_s - self.arrivals_s[first],
                                           waiting=waiting, unserved=count - first)
                self._stopped.set()  # every instance stops taking batches
                return None
            self._sleep_until(self.arrivals_s[first])
            # When the batch will fill: the arrival of the max_batch-th waiting query (or, when fewer remain, of the
            # schedule's last: nothing more will come). Reading that time ahead is what a put would tell a waiting
            # batcher at that moment; no query is taken before it arrives (the searchsorted below).
            filling_s = self.arrivals_s[min(first + self.max_batch, count) - 1]
            due_s = due_time(self.arrivals_s[first], filling_s, self.timeout_s, opened_s)
            self._sleep_until(due_s)
            if self._stopped.is_set():
                return None
            dispatched_s = self.clock()  # one stamp: every query taken arrived by the time it was dispatched
            arrived = int(np.searchsorted(self.arrivals_s, dispatched_s, side="right"))
            taken = min(self.max_batch, max(1, arrived - first))
            self._taken = first + taken
            return FormedBatch(list(range(first, first + taken)), opened_s, due_s, dispatched_s)


class Batcher:
    """A thread-safe queue of issued query ids that hands out batches (single-stream: arrivals follow completions)."""

    def __init__(self, max_batch: int, timeout_s: float, clock: Callable[[], float] = time.perf_counter):
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.clock = clock
        self._waiting: collections.deque[tuple[int, float]] = collections.deque()
        self._ready = threading.Condition()
        self._forming = threading.Lock()  # one instance forms a batch at a time; the others queue behind it
        self._closed_s: Optional[float] = None

    def put(self, query_ids: Sequence[int], arrived_s: float) -> None:
        """Queries that arrived at `arrived_s` join the queue."""
        with self._ready:
            self._waiting.extend((query_id, arrived_s) for query_id in query_ids)
            self._ready.notify_all()

    def close(self) -> None:
        """No more queries will come: waiting instances take what is left, then get None."""
        with self._ready:
            self._closed_s = self.clock()
            self._ready.notify_all()

    def next_batch(self) -> Optional[FormedBatch]:
        """Block until a batch is formed (full, or its oldest query timed out); None once closed and empty."""
        with self._forming, self._ready:
            opened_s = self.clock()
            while not self._waiting and self._closed_s is None:
                self._ready.wait()
            if not self._waiting:
                return None
            while len(self._waiting) < self.max_batch and self._closed_s is None:
                remaining = self._waiting[0][1] + self.timeout_s - self.clock()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            count = min(self.max_batch, len(self._waiting))
            full = len(self._waiting) >= self.max_batch
            if full:
                filling_s = self._waiting[self.max_batch - 1][1]
            else:  # closed: what is left goes now; otherwise the timeout decides
                filling_s = self._closed_s if self._closed_s is not None else math.inf
            due_s = due_time(self._waiting[0][1], filling_s, self.timeout_s, opened_s)
            ids = [self._waiting.popleft()[0] for _ in range(count)]
            return FormedBatch(ids, opened_s, due_s, self.clock())

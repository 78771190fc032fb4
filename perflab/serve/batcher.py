"""The dynamic batcher: queries wait in one queue; a free instance takes a batch when --max-batch queries wait,
or when the oldest waiting query has waited --batch-timeout-ms (Triton's max_queue_delay)."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass
class FormedBatch:
    """The queries of one batch; `opened_s` is when an instance began forming it, `dispatched_s` when it closed."""

    query_ids: list[int]
    opened_s: float
    dispatched_s: float


class Batcher:
    """A thread-safe queue of query ids that hands out batches; instances take turns forming them."""

    def __init__(self, max_batch: int, timeout_s: float, clock: Callable[[], float] = time.perf_counter):
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.clock = clock
        self._waiting: collections.deque[tuple[int, float]] = collections.deque()
        self._ready = threading.Condition()
        self._forming = threading.Lock()  # one instance forms a batch at a time; the others queue behind it
        self._closed = False

    def put(self, query_ids: Sequence[int], arrived_s: float) -> None:
        """Queries that arrived at `arrived_s` join the queue."""
        with self._ready:
            self._waiting.extend((query_id, arrived_s) for query_id in query_ids)
            self._ready.notify_all()

    def close(self) -> None:
        """No more queries will come: waiting instances take what is left, then get None."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def next_batch(self) -> Optional[FormedBatch]:
        """Block until a batch is formed (full, or its oldest query timed out); None once closed and empty."""
        with self._forming, self._ready:
            opened_s = self.clock()
            while not self._waiting and not self._closed:
                self._ready.wait()
            if not self._waiting:
                return None
            while len(self._waiting) < self.max_batch and not self._closed:
                remaining = self._waiting[0][1] + self.timeout_s - self.clock()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            count = min(self.max_batch, len(self._waiting))
            ids = [self._waiting.popleft()[0] for _ in range(count)]
            return FormedBatch(ids, opened_s, self.clock())

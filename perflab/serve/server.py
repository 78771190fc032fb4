"""Model instances fed by the batcher: one thread per instance, alive for the whole session (compiled graphs
and captured CUDA graphs stay with the thread that made them), stamping every query of every batch."""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, ContextManager, Optional, Protocol, Sequence

import numpy as np

from perflab.serve.batcher import BatchSource
from perflab.serve.metrics import QueryLog

JOIN_TIMEOUT_S = 5.0


class Engine(Protocol):
    """What one model instance runs: a batch of samples in, results back on the host."""

    def warm_up(self, rounds: int) -> None:
        """Run every batch shape the engine will see (compilation, capture, autotuning happen here)."""

    def serve(self, sample_ids: np.ndarray) -> tuple[float, float]:
        """Serve one batch; returns the seconds spent copying inputs in and results out (the rest is compute).
        An engine that generates tokens also sets `last_request` (a RequestTiming): its batch's token times."""


class Serving:
    """Instances at work on one point; `wait()` returns when every one has drained its batcher."""

    def __init__(self, finished: queue.Queue, instances: int):
        self._finished = finished
        self._instances = instances

    def stopped(self) -> bool:
        """True once some instance has stopped serving (the batcher was closed, or it failed)."""
        return not self._finished.empty()

    def wait(self) -> None:
        """Block until every instance has finished; re-raise the first error an instance hit."""
        errors = [self._finished.get() for _ in range(self._instances)]
        for error in errors:
            if error is not None:
                raise error


class Server:
    """`instances` threads, each owning one engine; a point hands every thread the same batcher and log."""

    def __init__(self, engines: Sequence[Engine], wear: Callable[[], ContextManager] = contextlib.nullcontext):
        self.engines = list(engines)
        self.wear = wear
        self._jobs: list[queue.Queue] = [queue.Queue() for _ in self.engines]
        self._finished: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._instance_loop, args=(index,), daemon=True,
                                          name=f"perflab-serve-instance-{index}") for index in range(len(engines))]
        for thread in self._threads:
            thread.start()

    def _instance_loop(self, index: int) -> None:
        engine = self.engines[index]
        with self.wear():  # thread-local state: inference mode, autocast settings, the levers' contexts
            while True:
                job = self._jobs[index].get()
                if job is None:
                    return
                error: Optional[BaseException] = None
                try:
                    job(engine)
                except BaseException as err:  # handed to the main thread, which raises it
                    error = err
                self._finished.put(error)

    def on_every_instance(self, run: Callable[[Engine], None]) -> Serving:
        """Hand `run(engine)` to every instance thread; `wait()` on the result for them to finish."""
        for jobs in self._jobs:
            jobs.put(run)
        return Serving(self._finished, len(self._jobs))

    def on_instance(self, index: int, run: Callable[[Engine], None]) -> Serving:
        """Hand `run(engine)` to one instance's thread."""
        self._jobs[index].put(run)
        return Serving(self._finished, 1)

    def warm_up(self, rounds: int) -> None:
        """Every instance runs every batch shape `rounds` times, in its own thread, one instance after another
        (torch.compile is not thread-safe while it compiles)."""
        for index in range(len(self.engines)):
            self.on_instance(index, lambda engine: engine.warm_up(rounds)).wait()

    def start(self, batcher: BatchSource, log: QueryLog, sample_of_query: np.ndarray,
              on_done: Optional[Callable[[list[int]], None]] = None) -> Serving:
        """Instances serve `batcher` until it has no more batches (`wait()` on the returned Serving);
        `on_done(query_ids)` is called as each batch completes."""
        def serve_batches(engine: Engine) -> None:
            while (batch := batcher.next_batch()) is not None:
                copy_in_s, copy_out_s = engine.serve(sample_of_query[batch.query_ids])
                done_s = batcher.clock()
                log.record_batch(batch, batch.dispatched_s + copy_in_s, done_s - copy_out_s, done_s)
                request = getattr(engine, "last_request", None)
                if request is not None:  # the last token came out as the compute ended
                    log.record_tokens(batch.query_ids, request, done_s - copy_out_s)
                if on_done is not None:
                    on_done(batch.query_ids)
        return self.on_every_instance(serve_batches)

    def close(self) -> None:
        """Stop the instance threads (after their current job)."""
        for jobs in self._jobs:
            jobs.put(None)
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)

"""One model instance: each batch's samples copied straight from the pinned sample pool into the instance's input
buffer on the device (on its own CUDA stream, one batched call for all rows, no host-side gather), the
model (after levers) run on them, and the batch's result rows copied back into the instance's pinned output buffer.

With --compile or --cuda-graphs a batch is padded up to a bucket so that only a few shapes are ever compiled or
captured, all in warm-up: in the server scenario 1, 2, 4, ... up to --bucket-step, then its multiples up to max
batch (powers of two alone padded a batch of 33 to 64: on the H100 the GPU was 95% busy at the max rate, so padding
is lost throughput); max batch alone offline, 1 in single-stream. Padding costs no copy: the rows past the batch
keep the samples they last held (the buffer starts full of real samples), and their results are not copied back.
Eager models run the exact batch size. With CUDA graphs the input buffer is the graphs' static input: a batch is
copied into it, then the graph replays."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Optional

import numpy as np
import torch

from perflab.step.calls import call_model, count_non_finite
from perflab.step.plan import StepPlan
from perflab.serve.pool import BatchCopier, SamplePool, batch_buffer, flat_tensors, rebuild

# on_results(sample_ids, outputs): a batch's results on the host, one row per query (valid until the next batch)
ResultsHandler = Callable[[np.ndarray, Any], None]


def buckets(max_batch: int, step: int) -> list[int]:
    """Powers of two below `step`, then multiples of `step` below `max_batch`, and `max_batch` itself: padding a
    batch costs at most `step` - 1 samples once it is past `step` (powers of two alone waste up to half of it)."""
    sizes, size = [], 1
    while size < min(step, max_batch):
        sizes.append(size)
        size *= 2
    return sizes + list(range(step, max_batch, step)) + [max_batch]


def batch_shapes(scenario: str, max_batch: int, step: int) -> list[int]:
    """The batch sizes a scenario forms, once padded: offline takes full batches, single-stream one query."""
    return {"offline": [max_batch], "single-stream": [1]}.get(scenario) or buckets(max_batch, step)


class ModelEngine:
    """A model instance over the staged sample pool (LoadGen's loaded sample set), shared by every instance."""

    def __init__(self, plan: StepPlan, pool: SamplePool, max_batch: int, sizes: Optional[list[int]], graphs: bool,
                 on_results: Optional[ResultsHandler] = None):
        """`sizes`: the padded batch sizes (None: run each batch at its own size); `graphs`: capture each."""
        self.plan = plan
        self.pool = pool
        self.max_batch = max_batch
        self.sizes = sizes
        self.on_results = on_results
        self.cuda = plan.device.type == "cuda"
        self.stream = torch.cuda.Stream(plan.device) if self.cuda else None
        # made once: recording the same events every batch is safe, as serve() waits for the last one
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        self.input_buffers = [batch_buffer(tensor, max_batch, plan.device) for tensor in pool.tensors]
        self.copier = BatchCopier(self.input_buffers, pool.tensors)
        self._inputs_of_size: dict[int, Any] = {}
        self.output_buffers: Optional[list[Optional[torch.Tensor]]] = None  # host rows, made at the first batch
        self.graphs: Optional[dict[int, tuple[torch.cuda.CUDAGraph, Any]]] = {} if graphs else None
        self.padded_samples = 0
        self.last_results: Any = None  # the last batch's rows on the host: checked for NaN/inf after each point
        with self._on_stream():  # every row holds a real sample from the start: padding is never garbage
            self._copy_in(np.arange(max_batch) % pool.count)
        if self.cuda:
            self.stream.synchronize()

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def _forward(self, inputs: Any) -> Any:
        """The model on a batch, called as `perflab run` calls it (dict -> keywords, tuple -> positional)."""
        with self.plan.autocast():
            return call_model(self.plan.model, inputs)

    def non_finite_outputs(self) -> int:
        """NaN/inf values in the last batch's results on the host (read after a point, never inside it)."""
        return count_non_finite(self.last_results) if self.last_results is not None else 0

    def inputs(self, size: int) -> Any:
        """The model input of a batch of `size`: views of the first rows of the input buffers (made once)."""
        if size not in self._inputs_of_size:
            self._inputs_of_size[size] = rebuild(self.pool.inputs, [buffer[:size] for buffer in self.input_buffers])
        return self._inputs_of_size[size]

    def _copy_in(self, sample_ids: np.ndarray) -> None:
        self.copier.copy(sample_ids, non_blocking=self.cuda)

    def _copy_out(self, outputs: Any, size: int, count: int) -> Any:
        """The first `count` rows of each output in the instance's host buffer (batch-first outputs), or a
        whole copy of an output that is not one row per sample."""
        flat = flat_tensors(outputs)
        if self.output_buffers is None:
            self.output_buffers = [torch.empty((self.max_batch, *t.shape[1:]), dtype=t.dtype, pin_memory=self.cuda)
                                   if _rows_of(t, size) else None for t in flat]
        host = []
        for tensor, buffer in zip(flat, self.output_buffers):
            if buffer is not None and _rows_of(tensor, size) and tensor.shape[1:] == buffer.shape[1:]:
                host.append(buffer[:count].copy_(tensor[:count], non_blocking=self.cuda))
            else:
                host.append(tensor.to("cpu", non_blocking=True) if self.cuda else tensor.detach().clone())
        return rebuild(outputs, host)

    def _bucket(self, count: int) -> int:
        return count if self.sizes is None else next(size for size in self.sizes if size >= count)

    def warm_up(self, rounds: int) -> None:
        """Every batch shape, `rounds` times (at least once); CUDA graphs are captured here."""
        for size in self.sizes or sorted({1, self.max_batch}):
            ids = np.arange(size) % self.pool.count
            if self.graphs is not None:
                self._capture(size, ids)
            for _ in range(max(rounds, 1)):
                self.serve(ids)
        self.padded_samples = 0

    def _capture(self, size: int, ids: np.ndarray) -> None:
        with torch.cuda.stream(self.stream):
            self._copy_in(ids)
            static_in = self.inputs(size)  # the input buffer itself: every batch is copied into it
            for _ in range(3):  # eager iterations before capture, as the CUDA graphs docs ask
                self._forward(static_in)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream):
                static_out = self._forward(static_in)
        self.graphs[size] = (graph, static_out)

    def serve(self, sample_ids: np.ndarray) -> tuple[float, float]:
        """Serve one batch; (seconds copying in, seconds copying out), from CUDA events on a GPU."""
        count = len(sample_ids)
        size = self._bucket(count)
        self.padded_samples += size - count
        if not self.cuda:
            began = time.perf_counter()
            self._copy_in(sample_ids)
            copied = time.perf_counter()
            outputs = self._forward(self.inputs(size))
            computed = time.perf_counter()
            host = self._copy_out(outputs, size, count)
            done = time.perf_counter()
            self._hand_back(sample_ids, host)
            return copied - began, done - computed
        began, copied, computed, done = self.events
        with torch.cuda.stream(self.stream):
            began.record()
            self._copy_in(sample_ids)
            copied.record()
            if self.graphs is not None:
                graph, outputs = self.graphs[size]
                graph.replay()
            else:
                outputs = self._forward(self.inputs(size))
            computed.record()
            host = self._copy_out(outputs, size, count)
            done.record()
        done.synchronize()  # releases the GIL while the stream drains: other instances keep launching
        self._hand_back(sample_ids, host)
        return began.elapsed_time(copied) / 1000, computed.elapsed_time(done) / 1000

    def _hand_back(self, sample_ids: np.ndarray, host: Any) -> None:
        self.last_results = host
        if self.on_results is not None:
            self.on_results(sample_ids, host)


def _rows_of(tensor: torch.Tensor, size: int) -> bool:
    """True for an output with one row per sample of a batch of `size`."""
    return tensor.dim() >= 1 and tensor.shape[0] == size

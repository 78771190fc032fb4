"""One model instance: samples gathered into a pinned host buffer, copied to the device on the instance's own
CUDA stream, the model (after levers) run on them, and the results copied back to the host.

With --compile or --cuda-graphs a batch is padded up to a bucket so that only a few shapes are ever compiled or
captured, all in warm-up: 1, 2, 4, ... max batch in the server scenario, max batch alone offline, 1 in
single-stream. Eager models run the exact batch size."""
from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import torch

from perflab.harness.data import in_memory_format, map_tensors
from perflab.harness.plan import StepPlan


def buckets(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, and `max_batch` itself."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch]


def batch_shapes(scenario: str, max_batch: int) -> list[int]:
    """The batch sizes a scenario forms, once padded: offline takes full batches, single-stream one query."""
    return {"offline": [max_batch], "single-stream": [1]}.get(scenario) or buckets(max_batch)


def first_tensor(tree: Any) -> torch.Tensor:
    found: list[torch.Tensor] = []
    map_tensors(tree, lambda t: found.append(t) or t)
    return found[0]


class ModelEngine:
    """A model instance over a pool of samples already in host memory (LoadGen's loaded sample set)."""

    def __init__(self, plan: StepPlan, pool: Any, max_batch: int, sizes: Optional[list[int]], graphs: bool):
        """`sizes`: the padded batch sizes (None: run each batch at its own size); `graphs`: capture each."""
        self.plan = plan
        self.pool = pool  # the model inputs of every loaded sample, stacked along dim 0
        self.max_batch = max_batch
        self.sizes = sizes
        self.cuda = plan.device.type == "cuda"
        self.stream = torch.cuda.Stream(plan.device) if self.cuda else None
        self.host_buffer = map_tensors(pool, lambda t: torch.empty((max_batch, *t.shape[1:]), dtype=t.dtype,
                                                                  pin_memory=self.cuda))
        self.graphs: Optional[dict[int, tuple[torch.cuda.CUDAGraph, Any, Any]]] = {} if graphs else None
        self.padded_samples = 0

    def _forward(self, inputs: Any) -> Any:
        with self.plan.autocast():
            return self.plan.model(inputs)

    def _gather(self, sample_ids: np.ndarray) -> tuple[Any, int]:
        """The samples' inputs in the pinned buffer, padded to the bucket; returns (inputs, padded size)."""
        count = len(sample_ids)
        size = count if self.sizes is None else next(s for s in self.sizes if s >= count)
        index = torch.as_tensor(np.concatenate([sample_ids, np.repeat(sample_ids[:1], size - count)]))
        self.padded_samples += size - count
        buffers = iter(_flat(self.host_buffer))  # the same traversal order as the pool's
        return map_tensors(self.pool, lambda t: torch.index_select(t, 0, index, out=next(buffers)[:size])), size

    def _to_device(self, host: Any) -> Any:
        moved = map_tensors(host, lambda t: t.to(self.plan.device, non_blocking=True))
        return in_memory_format(moved, self.plan.memory_format)

    def warm_up(self, rounds: int) -> None:
        """Every batch shape, `rounds` times (at least once); CUDA graphs are captured here."""
        sizes = self.sizes or sorted({1, self.max_batch})
        for size in sizes:
            ids = np.arange(size) % len(first_tensor(self.pool))
            if self.graphs is not None:
                self._capture(size, ids)
            for _ in range(max(rounds, 1)):
                self.serve(ids)
        self.padded_samples = 0

    def _capture(self, size: int, ids: np.ndarray) -> None:
        host, _ = self._gather(ids)
        with torch.cuda.stream(self.stream):
            static_in = self._to_device(host)
            for _ in range(3):  # eager iterations before capture, as the CUDA graphs docs ask
                self._forward(static_in)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream):
                static_out = self._forward(static_in)
        self.graphs[size] = (graph, static_in, static_out)

    def serve(self, sample_ids: np.ndarray) -> tuple[float, float]:
        """Serve one batch; (seconds copying in, seconds copying out), from CUDA events on a GPU."""
        began = time.perf_counter()
        host, size = self._gather(sample_ids)
        gathered_s = time.perf_counter() - began
        if not self.cuda:
            copied = time.perf_counter()
            outputs = self._forward(host)
            computed = time.perf_counter()
            map_tensors(outputs, lambda t: t.detach().clone())  # results handed back: one copy, as on a GPU
            return copied - began, time.perf_counter() - computed
        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        with torch.cuda.stream(self.stream):
            events[0].record()
            if self.graphs is not None:
                graph, static_in, static_out = self.graphs[size]
                map_tensors_pair(static_in, host, lambda dst, src: dst.copy_(src, non_blocking=True))
                events[1].record()
                graph.replay()
                outputs = static_out
            else:
                inputs = self._to_device(host)
                events[1].record()
                outputs = self._forward(inputs)
            events[2].record()
            map_tensors(outputs, lambda t: t.to("cpu", non_blocking=True))
            events[3].record()
        events[3].synchronize()
        return (gathered_s + events[0].elapsed_time(events[1]) / 1000, events[2].elapsed_time(events[3]) / 1000)


def _flat(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(tree, lambda t: found.append(t) or t)
    return found


def map_tensors_pair(destination: Any, source: Any, fn) -> None:
    """Apply fn(dst, src) to matching tensors of two same-shaped structures."""
    for dst, src in zip(_flat(destination), _flat(source)):
        fn(dst, src)

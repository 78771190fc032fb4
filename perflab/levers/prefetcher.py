"""--prefetcher stream: copy batch N+1 to the GPU on a side stream while batch N computes."""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from perflab.step.data import map_tensors, to_device
from perflab.bottlenecks import H2D_COPIES, INPUT_PIPELINE
from perflab.levers import LOADER_QUEUE, ONE_TRIAL, Address, Lever, TuneHints
from perflab.levers.data_path import _needs_loader


class StreamPrefetcher:
    """Iterates device batches; each was copied on a side stream one step ahead of its use.

    The consuming stream waits on the copy stream before using a batch, and every tensor is marked
    with `record_stream` so the caching allocator does not reuse its memory while compute still reads it.
    """

    def __init__(self, host_batches: Iterator[Any], device: torch.device,
                 memory_format: Optional[torch.memory_format] = None):
        self.host_batches = host_batches
        self.device = device
        self.memory_format = memory_format
        self.copy_stream = torch.cuda.Stream(device)
        self.pending: Any = None

    def _preload(self) -> None:
        host_batch = next(self.host_batches)
        with torch.cuda.stream(self.copy_stream):
            self.pending = to_device(host_batch, self.device, non_blocking=True, memory_format=self.memory_format)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.pending is None:
            self._preload()
        compute_stream = torch.cuda.current_stream(self.device)
        compute_stream.wait_stream(self.copy_stream)
        batch = self.pending
        map_tensors(batch, lambda tensor: tensor.record_stream(compute_stream) or tensor)
        self._preload()
        return batch


def _apply(plan, cfg) -> None:
    plan.pin_memory = True
    plan.device_feeder = lambda host_batches: StreamPrefetcher(host_batches, plan.device, plan.memory_format)


LEVERS = [
    Lever("prefetcher-stream", "prefetcher", "stream",
          "copy the next batch on a side CUDA stream while the current one computes",
          "CUDA, a DataLoader data source, pinned memory", (Address(H2D_COPIES, 2), Address(INPUT_PIPELINE, 4)), 15,
          _apply,
          in_code="copy the next batch on a side torch.cuda.Stream while the current one computes",
          when_lost="overlapping the copy with compute lost: the copy bandwidth is the limit: copy fewer bytes "
                    "(uint8, crops, decoded once on the GPU)",
          tune=TuneHints(ONE_TRIAL, data_path=LOADER_QUEUE), checks=_needs_loader("--prefetcher stream")),
]

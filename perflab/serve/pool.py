"""The loaded sample pool (LoadGen's performance sample set) and the copies out of it.

The pool is staged once, at load: every tensor in the memory format the model wants (channels-last for 4-D float
images) and, on a GPU, in pinned host memory. A batch is then copied sample by sample (a run of consecutive
samples as one copy) straight from the pool into the instance's input buffer: on a GPU that is one asynchronous
DMA per run on the instance's stream, with no host-side gather of the batch first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from perflab.harness.data import map_tensors


@dataclass
class SamplePool:
    """The model inputs of every loaded sample, stacked along dim 0 (a tensor or a structure of them)."""

    inputs: Any
    count: int

    @property
    def tensors(self) -> list[torch.Tensor]:
        return flat_tensors(self.inputs)


def flat_tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors of a structure, in map_tensors' traversal order."""
    found: list[torch.Tensor] = []
    map_tensors(tree, lambda t: found.append(t) or t)
    return found


def rebuild(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """`tree` with its tensors replaced, in traversal order, by `tensors`."""
    replacements = iter(tensors)
    return map_tensors(tree, lambda _: next(replacements))


def stage_pool(inputs: Any, count: int, device: torch.device,
               memory_format: Optional[torch.memory_format] = None) -> SamplePool:
    """The pool as it is served from: 4-D float tensors in `memory_format`, all pinned when `device` is a GPU."""
    pin = device.type == "cuda"

    def stage(tensor: torch.Tensor) -> torch.Tensor:
        image = memory_format is not None and tensor.dim() == 4 and tensor.is_floating_point()
        staged = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin,
                             memory_format=memory_format if image else torch.contiguous_format)
        return staged.copy_(tensor)
    return SamplePool(map_tensors(inputs, stage), count)


def batch_buffer(like: torch.Tensor, rows: int, device: torch.device, pin: bool = False) -> torch.Tensor:
    """An uninitialised buffer of `rows` samples laid out as `like` (a dense pool tensor: its strides do not depend
    on how many samples it holds, in contiguous and in channels-last layout alike)."""
    return torch.empty_strided((rows, *like.shape[1:]), like.stride(), dtype=like.dtype, device=device,
                               pin_memory=pin)


def consecutive_runs(sample_ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(first row, first sample, length) of each run of consecutive sample ids: one copy each."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    if ids.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [ids.size]])
    return [(int(start), int(ids[start]), int(end - start)) for start, end in zip(starts, ends)]


def copy_samples(destination: torch.Tensor, source: torch.Tensor, runs: list[tuple[int, int, int]],
                 non_blocking: bool) -> None:
    """Row r of `destination` <- sample ids[r] of `source`, one copy per run (on the current stream on a GPU)."""
    for row, sample, length in runs:
        destination[row:row + length].copy_(source[sample:sample + length], non_blocking=non_blocking)

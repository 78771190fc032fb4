"""The loaded sample pool (LoadGen's performance sample set) and the copies out of it.

The pool is staged once, at load: every tensor in the memory format the model wants (channels-last for 4-D float
images) and, on a GPU, in pinned host memory. A batch is then copied straight from the pool into the instance's
input buffer, row by row, in ONE call (torch._foreach_copy_ over views made once): on a GPU one asynchronous DMA
per sample on the instance's stream, issued from C++, with no host-side gather of the batch first. One Python
`copy_` per sample (256 calls per batch, each taking the GIL) had the instances' threads contend for it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from perflab.step.data import map_tensors


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


class BatchCopier:
    """Copies a batch of pool samples into an instance's input buffers: the per-row views of every buffer and the
    per-sample views of every pool tensor are made once, so a batch is one `_foreach_copy_` over two lists."""

    def __init__(self, buffers: list[torch.Tensor], pool_tensors: list[torch.Tensor]):
        self.buffer_rows = [list(buffer.unbind(0)) for buffer in buffers]
        self.pool_samples = [list(tensor.unbind(0)) for tensor in pool_tensors]

    def copy(self, sample_ids: np.ndarray, non_blocking: bool) -> None:
        """Row r of every buffer <- sample sample_ids[r] of the pool (on the current stream on a GPU)."""
        ids = np.asarray(sample_ids).tolist()
        destinations: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        for rows, samples in zip(self.buffer_rows, self.pool_samples):
            destinations += rows[:len(ids)]
            sources += [samples[sample] for sample in ids]
        if destinations:
            # In torch since 2.1 (pytorch#107226) with non_blocking; host-to-device pairs take its per-tensor path.
            torch._foreach_copy_(destinations, sources, non_blocking=non_blocking)

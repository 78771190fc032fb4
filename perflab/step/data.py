"""Where batches come from: a DataLoader over the workload's dataset, or batches pre-staged on the device."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader, Sampler

from perflab.errors import UserCodeError, is_users_fault

Batch = Any


class CyclingSampler(Sampler):
    """Indices 0..n-1 in a fixed shuffled order, repeated forever, so one loader serves every trial.

    With `world_size` > 1, rank r takes every world_size-th index of that order from position r
    (DistributedSampler's split): batch k of all ranks together is batch k of one rank at world_size x the
    batch size, which is what the distributed quality gate compares against.
    """

    def __init__(self, length: int, seed: int, rank: int = 0, world_size: int = 1):
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed)).tolist()
        self.order = order[rank::world_size]

    def __iter__(self) -> Iterator[int]:
        return itertools.cycle(self.order)

    def __len__(self) -> int:  # DataLoader asks; the stream is endless
        return len(self.order)


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """Apply `fn` to every tensor in a tensor / tuple / list / dict (any mapping, returned as a dict) structure."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(value, fn) for value in batch)
    return batch


def in_memory_format(batch: Batch, memory_format: Optional[torch.memory_format]) -> Batch:
    """4-D float tensors of a batch in `memory_format` (channels-last), others untouched."""
    if memory_format is None:
        return batch
    return map_tensors(batch, lambda t: t.contiguous(memory_format=memory_format)
                       if t.dim() == 4 and t.is_floating_point() else t)


def to_device(batch: Batch, device: torch.device, non_blocking: bool,
              memory_format: Optional[torch.memory_format] = None) -> Batch:
    """Copy a batch to the device; 4-D float tensors take `memory_format` when given."""
    moved = map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=non_blocking))
    return in_memory_format(moved, memory_format)


def make_loader(dataset, batch_size: int, workers: int, pin_memory: bool, persistent_workers: bool,
                prefetch_factor: Optional[int], collate_fn, seed: int, shard: tuple[int, int] = (0, 1)) -> DataLoader:
    """An endless DataLoader with the data-path levers applied; `shard` = (rank, world size)."""
    options: dict[str, Any] = {}
    if workers > 0:
        options["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            options["prefetch_factor"] = prefetch_factor
    return DataLoader(dataset, batch_size=batch_size, sampler=CyclingSampler(len(dataset), seed, *shard),
                      num_workers=workers, pin_memory=pin_memory, drop_last=True,
                      collate_fn=collate_fn, **options)


def loader_batches(loader: DataLoader) -> Iterator[Batch]:
    """The loader's batches; an exception from the user's dataset or collate_fn becomes a UserCodeError.

    With workers, torch re-raises a worker's exception here with the worker's traceback as text, which the
    error reads its frames from.
    """
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except Exception as err:
            if not is_users_fault(err):
                raise
            where = f"in {loader.num_workers} DataLoader worker(s)" if loader.num_workers else "in the main process"
            raise UserCodeError(f"loading a batch of {loader.batch_size} items from your dataset (its __getitem__ "
                                f"and the collate_fn, {where})", err) from err
        yield batch


def first_batches(loader: DataLoader, count: int) -> list[Batch]:
    """The first `count` batches of a loader (used to pre-stage device batches and for checks)."""
    return list(itertools.islice(loader_batches(loader), count))


class DeviceBatches:
    """Cycles over a few distinct batches already on the device: measures the model, not the loader."""

    STAGED = 4  # distinct batches, so repeated steps do not read one cached input

    def __init__(self, host_batches: list[Batch], device: torch.device,
                 memory_format: Optional[torch.memory_format] = None):
        self.batches = [to_device(b, device, non_blocking=False, memory_format=memory_format)
                        for b in host_batches]

    def __iter__(self) -> Iterator[Batch]:
        return itertools.cycle(self.batches)

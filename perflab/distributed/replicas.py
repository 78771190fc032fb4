"""Are the data-parallel replicas still the same model? One checksum of each rank's weights after the timed steps.

DDP keeps one full copy of the weights on every rank and all-reduces the gradients, so after any number of steps
every copy is bit-for-bit the same. If they differ, the gradients were not all-reduced — a lever (or the user's
code) broke DDP's synchronisation — and the run's speed was bought by skipping the communication it measures. Found
on 2x H200 (2026-11-26): with `static_graph=True`, one backward through the unwrapped module before DDP's first
forward leaves DDP's reducer silent for good; the "after the levers" run then scaled at 99.8% with no all-reduce
at all. FSDP shards the weights, so its ranks hold different tensors by design and are not compared.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

RELATIVE_TOLERANCE = 1e-6  # replicas are bit-identical; this only absorbs the float64 sum's own order


def weights_checksum(model: nn.Module) -> float:
    """Sum of every parameter's elements in float64: equal on ranks whose weights are equal."""
    with torch.no_grad():
        total = sum((param.detach().double().sum() for param in model.parameters()),
                    torch.zeros((), dtype=torch.float64))
    return float(total)


def diverged(checksums: Sequence[Optional[float]]) -> Optional[str]:
    """Why the replicas differ (each rank's checksum), or None when they agree or a rank has none."""
    known = [value for value in checksums if value is not None]
    if len(known) < 2 or len(known) != len(checksums) or not all(math.isfinite(value) for value in known):
        return None
    scale = max(1.0, max(abs(value) for value in known))
    if max(known) - min(known) <= RELATIVE_TOLERANCE * scale:
        return None
    listed = ", ".join(f"rank {rank}: {value:.9g}" for rank, value in enumerate(checksums))
    return ("the ranks' weights differ after the timed steps (weights checksum " + listed + "): the gradients were "
            "not all-reduced, so this run skipped the communication it measures. A lever or the step broke DDP's "
            "synchronisation; its speed is not a result")

"""Allocator churn: the loss calls torch.cuda.empty_cache() every step, so the caching allocator hands its
free blocks back to the driver (cudaFree, which waits for the device) and allocates them again (cudaMalloc)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class TidyLoss(nn.Module):
    """MSE that "frees memory" after computing the loss: a habit copied from notebooks that fight OOMs."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed  # workload option fixed=1: no empty_cache in the step (the advice applied)

    def forward(self, output, target):
        loss = nn.functional.mse_loss(output, target)
        if not self.fixed and torch.cuda.is_available() and output.is_cuda:
            torch.cuda.empty_cache()  # the planted churn; on the CPU there is no cache to empty
        return loss


def build(cfg) -> Workload:
    # Wide enough that the step's activations and gradients are blocks of several MB: each step the allocator
    # must get them back from the driver after the loss emptied its cache.
    width = size(cfg, cpu=256, cuda=4096)
    model = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(width, width), nn.ReLU())])
    return Workload(name="planted-empty-cache-loss", model=model,
                    dataset=RandomItems(512, (width,), (width,), cfg.seed),
                    loss_fn=TidyLoss(fixed=bool(cfg.workload_options.get("fixed"))), default_data="device",
                    description="planted: torch.cuda.empty_cache() in the loss, every step")

"""Host-device sync outside the model: the loss reads per-class counts on the host with `.tolist()` every step."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class CountingLoss(nn.Module):
    """MSE plus a per-class count read on the host (a metric that syncs once per step)."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed  # workload option fixed=1: counts kept on the device (the advice applied)

    def forward(self, output, target):
        if self.fixed:  # counted on the device with a fixed size (bincount syncs on CUDA to size its output)
            classes = output.argmax(dim=1)
            self.last_counts = torch.zeros(output.shape[1], device=output.device).index_add_(
                0, classes, torch.ones_like(classes, dtype=torch.float32))
            return nn.functional.mse_loss(output, target)
        counts = (output.argmax(dim=1).bincount(minlength=output.shape[1])).tolist()  # the planted sync
        self.last_counts = counts
        return nn.functional.mse_loss(output, target)


def build(cfg) -> Workload:
    width = size(cfg, cpu=128, cuda=1024)
    layers = [layer for _ in range(8) for layer in (nn.Linear(width, width), nn.ReLU())]
    return Workload(name="planted-tolist-loss", model=nn.Sequential(*layers),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=CountingLoss(bool(cfg.workload_options.get("fixed"))),
                    default_data="device", description="planted: .tolist() of a metric in the loss, once per step")

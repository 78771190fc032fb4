"""Launch overhead: hundreds of tiny ops per step (run at --batch 1)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems


class ManyTinyOps(nn.Module):
    def __init__(self, layers: int = 100, width: int = 32):
        super().__init__()
        self.scales = nn.Parameter(torch.ones(layers, width))
        self.shifts = nn.Parameter(torch.zeros(layers, width))

    def forward(self, x):
        for scale, shift in zip(self.scales, self.shifts):
            x = torch.relu(x * scale + shift)
        return x


def build(cfg) -> Workload:
    layers = int(cfg.workload_options.get("layers", 100))
    return Workload(name="planted-tiny-ops", model=ManyTinyOps(layers), dataset=RandomItems(256, (32,), (32,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device", description="planted: hundreds of tiny ops")

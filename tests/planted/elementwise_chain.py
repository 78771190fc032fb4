"""Memory bandwidth: a long chain of elementwise ops on large activations, almost no FLOPs."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class ElementwiseChain(nn.Module):
    def __init__(self, length: int = 24):
        super().__init__()
        self.length = length
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        for _ in range(self.length):
            x = torch.sin(x) * self.scale + 0.1
        return x.mean(dim=(1, 2, 3)).unsqueeze(1)


def build(cfg) -> Workload:
    res = size(cfg, cpu=64, cuda=256)
    return Workload(name="planted-elementwise-chain", model=ElementwiseChain(),
                    dataset=RandomItems(64, (8, res, res), (1,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: long elementwise chain on large tensors")

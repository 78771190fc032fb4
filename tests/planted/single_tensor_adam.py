"""Single-tensor optimizer: Adam with foreach=False over many small parameters (one kernel per op per tensor)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    width = size(cfg, cpu=32, cuda=128)
    model = nn.Sequential(*[layer for _ in range(24) for layer in (nn.Linear(width, width), nn.LayerNorm(width))])
    return Workload(name="planted-single-tensor-adam", model=model,
                    dataset=RandomItems(256, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", optimizer_factory=lambda params: torch.optim.Adam(params, foreach=False),
                    description="planted: single-tensor Adam over many small parameters")

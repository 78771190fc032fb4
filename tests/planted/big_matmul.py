"""Compute bound: a few large matmuls per step."""
from __future__ import annotations

from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    width = size(cfg, cpu=512, cuda=8192)
    model = nn.Sequential(nn.Linear(width, width, bias=False), nn.Linear(width, width, bias=False))
    return Workload(name="planted-big-matmul", model=model, dataset=RandomItems(max(cfg.batch_size, 64), (width,),
                    (width,), cfg.seed), loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: large matmuls")

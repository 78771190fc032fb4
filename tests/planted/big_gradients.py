"""Collectives bound (with --nproc 2+): large weights, so large gradients to all-reduce, on a tiny batch."""
from __future__ import annotations

from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    width = size(cfg, cpu=256, cuda=8192)
    layers = int(cfg.workload_options.get("layers", 4))
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    return Workload(name="planted-big-gradients", model=model, dataset=RandomItems(64, (width,), (width,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: large gradients, tiny compute (collectives bound across ranks)")

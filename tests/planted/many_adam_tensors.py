"""Adam(foreach=False) over about 600 small tensors: the optimizer launches a dozen kernels per tensor, more than the
forward and backward together. The fix (workload option fixed=1): Adam(foreach=True)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    blocks = size(cfg, cpu=300, cuda=300)  # a Linear each: two tensors per block
    width = 32 if cfg.device == "cuda" else 8
    foreach = bool(int(cfg.workload_options.get("fixed", 0)))  # fixed=1: the expert's fix
    model = nn.Sequential(*[layer for _ in range(blocks) for layer in (nn.Linear(width, width), nn.Tanh())])
    return Workload(name="planted-many-adam-tensors", model=model,
                    dataset=RandomItems(64, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device",
                    optimizer_factory=lambda params: torch.optim.Adam(params, foreach=foreach),
                    description="planted: Adam(foreach=False) over about 600 small tensors")

"""Host-device sync: `.item()` after every layer (a NaN check that reads an activation on the host)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class CheckedStack(nn.Module):
    def __init__(self, width: int, layers: int = 12, fixed: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.fixed = fixed  # workload option fixed=1: no check read on the host (the advice applied)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
            if self.fixed:
                continue
            value = x[0, 0].item()  # the planted sync: a NaN check read on the host
            if value != value:
                raise FloatingPointError("non-finite activations")
        return x


def build(cfg) -> Workload:
    # On CUDA a layer must take the GPU a little longer than the host needs to launch it (~90 µs of fp32
    # matmul at batch 512): then the host reaches each sync with work still queued, and every sync leaves the
    # GPU idle while the host launches the next layer. Much bigger layers hide the syncs (compute bound);
    # much smaller ones make launch overhead the bottleneck.
    width = size(cfg, cpu=128, cuda=2048)
    return Workload(name="planted-item-sync", model=CheckedStack(width, fixed=bool(cfg.workload_options.get("fixed"))),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: .item() after every layer")

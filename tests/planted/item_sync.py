"""Host-device sync: an `.item()` after every layer (a NaN check that reads the value on the host)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class CheckedStack(nn.Module):
    def __init__(self, width: int, layers: int = 12):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
            if not torch.isfinite(x.sum()).item():  # the planted sync
                raise FloatingPointError("non-finite activations")
        return x


def build(cfg) -> Workload:
    # On CUDA each layer must take the GPU longer than the host needs to launch the next one; only then
    # does the sync (not launch overhead) leave the GPU idle.
    width = size(cfg, cpu=128, cuda=4096)
    return Workload(name="planted-item-sync", model=CheckedStack(width),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: .item() after every layer")

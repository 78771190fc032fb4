"""Pageable async copy mid-forward: a mask built on the host from a Python list, copied with non_blocking=True.

From pageable memory the copy is not asynchronous: the driver drains the stream before it stages the bytes, so
cudaMemcpyAsync blocks the host like a synchronize, and the GPU waits while the host launches what follows.
"""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class MaskedStack(nn.Module):
    def __init__(self, width: int, layers: int = 12, fixed: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.keep = [float(i % 4 != 0) for i in range(width)]  # a feature mask kept as a Python list
        self.fixed = fixed  # workload option fixed=1: the mask lives on the device (the advice applied)
        self.register_buffer("keep_on_device", torch.tensor(self.keep))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
            if self.fixed:
                mask = self.keep_on_device
            else:  # the planted copy: a pageable host tensor each layer; non_blocking does not help
                mask = torch.tensor(self.keep).to(x.device, non_blocking=True)
            x = x * mask
        return x


def build(cfg) -> Workload:
    # Sized like item_sync.py: a layer keeps the GPU busy a little longer than the host needs to launch it,
    # so every blocking copy drains a queue that holds work.
    width = size(cfg, cpu=128, cuda=2048)
    return Workload(name="planted-pageable-async-copy",
                    model=MaskedStack(width, fixed=bool(cfg.workload_options.get("fixed"))),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: pageable non_blocking copy in every layer")

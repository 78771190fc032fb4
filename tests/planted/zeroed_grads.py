"""Gradients zeroed instead of set to None: a memset per parameter every step, and grads summed into, not set."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class ZeroingSGD(torch.optim.SGD):
    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=False)  # the planted habit


def build(cfg) -> Workload:
    width = size(cfg, cpu=64, cuda=1024)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(16)])
    return Workload(name="planted-zeroed-grads", model=model, dataset=RandomItems(256, (width,), (width,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    optimizer_factory=lambda params: (torch.optim.SGD if cfg.workload_options.get("fixed") else
                                                      ZeroingSGD)(params, lr=1e-3, momentum=0.9),
                    description="planted: grads zeroed, not set to None")

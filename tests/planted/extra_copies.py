"""Extra copies inside the model: a constant rebuilt on the host and moved every step, transposes made contiguous
and cloned for nothing."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class Copying(nn.Module):
    def __init__(self, width: int, fixed: bool = False):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.fixed = fixed  # workload option fixed=1: no copies (the advice applied)

    def forward(self, x):
        if self.fixed:
            return self.proj(x + 2.0)
        for _ in range(4):
            offset = torch.full((x.shape[-1],), 0.5).to(x.device)  # planted: made on the host each call
            x = x.transpose(0, 1).contiguous().transpose(0, 1).contiguous().clone() + offset  # planted copies
        return self.proj(x)


def build(cfg) -> Workload:
    width = size(cfg, cpu=512, cuda=8192)
    return Workload(name="planted-extra-copies", model=Copying(width, bool(cfg.workload_options.get("fixed"))),
                    dataset=RandomItems(256, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", repeat_items=True,  # the GPU bench's batch (1024) is larger than the items
                    description="planted: extra device copies in forward")

"""A workload whose forward hangs on rank 1 at its third call: rank 0 then waits in an all-reduce that never ends."""
from __future__ import annotations

import os
import time

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems


class StallsOnRankOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 3:
            time.sleep(3600)
        return self.linear(x)


def build(cfg) -> Workload:
    return Workload(name="planted-stalls-on-rank1", model=StallsOnRankOne(),
                    dataset=RandomItems(64, (16,), (4,), cfg.seed), loss_fn=nn.MSELoss(),
                    description="planted: rank 1 hangs in its third forward")

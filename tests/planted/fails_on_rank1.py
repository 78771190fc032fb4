"""A workload whose forward raises on rank 1 at its third call: rank 0 is then waiting in an all-reduce."""
from __future__ import annotations

import os

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems

MESSAGE = "planted failure on rank 1"


class FailsOnRankOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 3:
            self.misbehave()
        return self.linear(x)

    def misbehave(self) -> None:
        raise ValueError(MESSAGE)


def build(cfg) -> Workload:
    return Workload(name="planted-fails-on-rank1", model=FailsOnRankOne(), dataset=RandomItems(64, (16,), (4,), cfg.seed),
                    loss_fn=nn.MSELoss(), description="planted: rank 1 raises in its third forward")

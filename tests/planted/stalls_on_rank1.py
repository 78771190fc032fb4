"""A workload whose forward hangs on rank 1 at its third call: rank 0 then waits in an all-reduce that never ends."""
from __future__ import annotations

import time

from torch import nn

from perflab import Workload
from fails_on_rank1 import FailsOnRankOne
from planted_common import RandomItems


class StallsOnRankOne(FailsOnRankOne):
    def misbehave(self) -> None:
        time.sleep(3600)


def build(cfg) -> Workload:
    return Workload(name="planted-stalls-on-rank1", model=StallsOnRankOne(),
                    dataset=RandomItems(64, (16,), (4,), cfg.seed), loss_fn=nn.MSELoss(),
                    description="planted: rank 1 hangs in its third forward")

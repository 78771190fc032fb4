"""A tiny model that reports on the process running it (tune's warm worker, tests/test_tune_worker.py): with the option
record=PATH, its first forward appends the weights it starts from and the next random draw to PATH; with exit_code=N,
its first forward ends the process at once (os._exit(N)), as a crash in native code would."""
from __future__ import annotations

import json
import os

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems


class Probe(nn.Module):
    def __init__(self, record: str, exit_code: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.record, self.exit_code, self.started = record, exit_code, False

    def forward(self, x):
        if not self.started:
            self.started = True
            if self.exit_code:
                os._exit(self.exit_code)
            if self.record:
                start = {"weights": [p.detach().double().sum().item() for p in self.parameters()],
                         "next_draw": torch.rand(1).item()}
                with open(self.record, "a") as log:
                    log.write(json.dumps(start) + "\n")
        return self.net(x)


def build(cfg) -> Workload:
    options = cfg.workload_options
    model = Probe(options.get("record", ""), int(options.get("exit_code", 0)))
    return Workload(name="planted-trial-probe", model=model, dataset=RandomItems(64, (16,), (4,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device", description="planted: reports on its process")

"""Simulated out-of-memory: a small MLP whose forward raises torch.OutOfMemoryError (with CUDA's message) once the
batch is over `fits` samples (option fits=N, default 8), so the OOM path of every command runs on a CPU."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems

MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
           "1.06 GiB is free. Including non-PyTorch memory, this process has 78.10 GiB memory in use. Of the "
           "allocated memory 70.52 GiB is allocated by PyTorch, and 7.00 GiB is reserved by PyTorch but unallocated.")


class FitsUpTo(nn.Module):
    def __init__(self, fits: int):
        super().__init__()
        self.fits = fits
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        if x.shape[0] > self.fits:
            raise torch.OutOfMemoryError(MESSAGE)
        return self.net(x)


def build(cfg) -> Workload:
    fits = int(cfg.workload_options.get("fits", 8))
    return Workload(name="planted-oom-over-batch", model=FitsUpTo(fits), dataset=RandomItems(64, (32,), (4,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: out of memory above a batch size (simulated)")

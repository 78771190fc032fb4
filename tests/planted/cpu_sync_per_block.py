"""Host-device sync: every block copies a per-block statistic to the host with `.cpu()`, for logging."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class LoggedBlocks(nn.Module):
    def __init__(self, width: int, blocks: int = 12):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.activation_log: list[torch.Tensor] = []  # what a training script would print every N steps

    def forward(self, x):
        self.activation_log.clear()
        for block in self.blocks:
            x = torch.relu(block(x))
            # the planted sync: a device-to-host copy into pageable memory blocks until the queue drains
            self.activation_log.append(x.detach().abs().mean().cpu())
        return x


def build(cfg) -> Workload:
    # Sized like item_sync.py: on CUDA a block (a 2048-wide fp32 matmul at batch 512, ~120 µs on an H100) takes
    # the GPU a little longer than the host needs to launch it, so every sync drains a queue that holds work
    # and the GPU then waits while the host launches the next block. On the CPU, where `.cpu()` does nothing,
    # the blocks are wide enough that the matmuls clearly dominate the step.
    width = size(cfg, cpu=512, cuda=2048)
    return Workload(name="planted-cpu-sync-per-block", model=LoggedBlocks(width),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: .cpu() of a per-block statistic, for logging")

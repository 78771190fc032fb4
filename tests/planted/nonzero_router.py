"""Host-device sync: every block routes its tokens to one of two experts with torch.nonzero (a
data-dependent output size, so the host must wait for the count before it can go on)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class RoutedBlock(nn.Module):
    def __init__(self, width: int, experts: int = 2):
        super().__init__()
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x):
        choice = self.router(x).argmax(dim=-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            tokens = torch.nonzero(choice == index).squeeze(1)  # the planted sync
            out = out.index_add(0, tokens, torch.relu(expert(x.index_select(0, tokens))))
        return x + out


class Router(nn.Module):
    def __init__(self, width: int, blocks: int = 6):
        super().__init__()
        self.blocks = nn.ModuleList(RoutedBlock(width) for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build(cfg) -> Workload:
    # On CUDA each expert's matmul (about half of 512 tokens x 2048 wide) keeps the GPU busy a little longer
    # than the host needs to launch the block, so each nonzero waits for queued work, then the GPU waits for
    # the host to launch the rest.
    width = size(cfg, cpu=128, cuda=2048)
    return Workload(name="planted-nonzero-router", model=Router(width),
                    dataset=RandomItems(512, (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: torch.nonzero routes tokens in every block")

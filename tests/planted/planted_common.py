"""Shared bits of the planted workloads: sizes by device, a fixed-batch dataset, a regression loss."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


def on_cuda(cfg) -> bool:
    return cfg.device == "cuda"


def size(cfg, cpu: int, cuda: int) -> int:
    return int(cfg.workload_options.get("size", cuda if on_cuda(cfg) else cpu))


class RandomItems(Dataset):
    """`length` random (input, target) pairs of fixed shapes, made once from a seed."""

    def __init__(self, length: int, input_shape: tuple, target_shape: tuple, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(length, *input_shape, generator=gen)
        self.targets = torch.randn(length, *target_shape, generator=gen)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]


class ResidualBlocks(nn.Module):
    """Blocks applied in turn, each added to its input (named blocks.0, blocks.1 ... in traces)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

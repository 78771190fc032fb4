"""Activation memory bound: a deep, narrow MLP (LayerNorm + GELU per layer) whose saved activations dwarf its
weights as the batch grows; its layers are one ModuleList of repeated blocks (checkpointable)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from perflab import Workload
from planted_common import RandomItems, size


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class DeepMLP(nn.Module):
    def __init__(self, width: int, layers: int, checkpointed: bool):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, width)
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed and self.training else block(x)
        return self.head(x)


def build(cfg) -> Workload:
    width = size(cfg, cpu=64, cuda=1024)
    layers = int(cfg.workload_options.get("layers", 4 if cfg.device != "cuda" else 24))
    model = DeepMLP(width, layers, bool(cfg.activation_checkpointing))
    return Workload(name="planted-activation-heavy", model=model, dataset=RandomItems(64, (width,), (width,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device", supports_activation_checkpointing=True, repeat_items=True,
                    description="planted: activation memory (deep narrow MLP, checkpointable blocks)")

"""Hand-written attention: matmul -> softmax -> matmul over an s x s score matrix in every block (no SDPA)."""
from __future__ import annotations

import math

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, ResidualBlocks, size


class HandAttention(nn.Module):
    def __init__(self, width: int, heads: int, fixed: bool = False):
        super().__init__()
        self.heads = heads
        self.fixed = fixed  # workload option fixed=1: the SDPA rewrite, to measure what the advice gains
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        if self.fixed:
            mixed = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # the planted s x s matrix
            weights = torch.softmax(scores, dim=-1)
            mixed = torch.matmul(weights, v)
        return self.out(mixed.transpose(1, 2).reshape(batch, seq, width))


def build(cfg) -> Workload:
    seq = size(cfg, cpu=128, cuda=2048)
    width = 256 if cfg.device == "cuda" else 64
    fixed = bool(cfg.workload_options.get("fixed"))
    model = ResidualBlocks(HandAttention(width, 4, fixed) for _ in range(4))
    return Workload(name="planted-hand-attention", model=model,
                    dataset=RandomItems(max(cfg.batch_size, 8), (seq, width), (seq, width), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: hand-written attention over an s x s score matrix")

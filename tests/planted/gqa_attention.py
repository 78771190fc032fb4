"""Grouped-query attention written by hand: K/V heads repeated to the query heads with repeat_interleave, a causal
mask built with triu and applied with masked_fill(-inf), then matmul -> softmax -> matmul. The fix (workload option
fixed=1): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) (torch >= 2.5; before it, the
K/V repeated as here with is_causal=True)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from perflab import Workload
from planted_common import RandomItems, ResidualBlocks, size

ENABLE_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


class GroupedQueryAttention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, fixed: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.fixed = fixed  # fixed=1: the expert's SDPA rewrite, to measure what the advice gains
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head_dim)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q = self.q(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.fixed:
            mixed = self._sdpa(q, k, v)
        else:
            groups = self.heads // self.kv_heads
            k = k.repeat_interleave(groups, dim=1)  # the planted GQA: K/V copied to every query head
            v = v.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(causal, float("-inf"))  # the planted hand-built causal mask
            mixed = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(mixed.transpose(1, 2).reshape(batch, seq, width))

    def _sdpa(self, q, k, v):
        if ENABLE_GQA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        groups = self.heads // self.kv_heads
        return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                              is_causal=True)


def build(cfg) -> Workload:
    seq = size(cfg, cpu=128, cuda=2048)
    width = 512 if cfg.device == "cuda" else 64
    fixed = bool(int(cfg.workload_options.get("fixed", 0)))
    model = ResidualBlocks(GroupedQueryAttention(width, 8, 2, fixed) for _ in range(4))
    return Workload(name="planted-gqa-attention", model=model,
                    dataset=RandomItems(max(cfg.batch_size, 8), (seq, width), (seq, width), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: grouped-query attention by hand (repeat_interleave, masked_fill causal mask)")

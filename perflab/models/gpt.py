"""One GPT block, shared by the `transformer` workload (training, checkpointing, `--sdpa` backends) and the
generation decoder (KV caches): pre-norm causal self-attention through F.scaled_dot_product_attention, then a
GELU MLP 4x wide.

Attention goes through SDPA, so `--sdpa flash|efficient|math` (a context around the step) picks its kernel and
activation checkpointing wraps whole blocks from the model that owns them. While generating, the decoder
attaches a KV cache to each attention layer and passes the new tokens' positions; the block then attends to
everything cached. This module imports torch only, so workloads/ and generation/ can both import it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; with a KV cache attached (`cache`), new tokens attend to every cached one."""

    def __init__(self, dim: int, heads: int, bias: bool = True):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.cache = None  # a DynamicKVCache or StaticKVCache (perflab/models/kv_cache.py) while generating

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`positions`: where the new tokens sit, given only to read and write the attached cache; `mask`: which
        cached positions each new token sees (None: causal among the new tokens, all cached ones)."""
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        if positions is not None and self.cache is not None:
            k, v = self.cache.update(positions, k, v)
        if mask is None:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(attended.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, bias: bool = True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=bias), nn.GELU(), nn.Linear(4 * dim, dim, bias=bias))

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), positions, mask)
        return x + self.mlp(self.norm2(x))

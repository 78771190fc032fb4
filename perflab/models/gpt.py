"""One decoder block in two families, shared by the `transformer` workload (training, checkpointing, `--sdpa`
backends) and the generation decoder (KV caches):

- "gpt": pre-norm LayerNorm, multi-head causal self-attention, a GELU MLP 4x wide (positions come from a learned
  table in the model that owns the blocks);
- "llama": pre-norm RMSNorm, grouped-query attention (fewer key/value heads than query heads) with rotary position
  embeddings (RoPE), a SwiGLU MLP.

Attention goes through F.scaled_dot_product_attention, so `--sdpa flash|efficient|math` (a context around the step)
picks its kernel and activation checkpointing wraps whole blocks from the model that owns them. While generating,
the decoder attaches a KV cache to each attention layer and passes the new tokens' positions; the block then
attends to everything cached. A cache holds only the key/value heads, so grouped-query attention stores (and
reads) heads/kv_heads times fewer bytes. This module imports torch only, so workloads/ and generation/ can both
import it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("gpt", "llama")
# SDPA repeats grouped key/value heads itself from torch 2.5 (enable_gqa); before, they are repeated here
SDPA_TAKES_GQA = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def rotary_tables(max_seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, (max_seq, head_dim) each, in fp32: pair i of a head rotates
    by position x theta^(-2i/head_dim), pairs being (i, i + head_dim/2) (the transformers Llama convention)."""
    inverse_frequency = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    angles = torch.outer(torch.arange(max_seq, dtype=torch.int64).float(), inverse_frequency)
    doubled = torch.cat((angles, angles), dim=-1)
    return doubled.cos(), doubled.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, T, head_dim) queries or keys by the (T, head_dim) angles of their positions."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SDPA of (batch, heads, T, d) queries over (batch, kv_heads, S, d) keys and values; query head h reads key/value
    head h // (heads / kv_heads). `mask` (broadcast over batch and heads): which positions each query sees; None:
    causal among the T new tokens (T > 1), or everything (T = 1)."""
    length, groups = q.shape[2], q.shape[1] // k.shape[1]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and length > 1)
    if mask is not None or length == 1:
        return _grouped_queries(q, k, v, mask)
    if SDPA_TAKES_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1),
                                          is_causal=True)


def _grouped_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The queries of a group's heads as one longer query sequence over its one key/value head: each cached key and
    value is read once (not once per query head, as repeating them would), which is what decode steps spend on."""
    batch, heads, length, head_dim = q.shape
    kv_heads = k.shape[1]
    folded = q.reshape(batch, kv_heads, heads // kv_heads * length, head_dim)
    if mask is not None:  # row g*T + t of the folded queries is query t of the group's g-th head
        lead, seen = mask.shape[:-2], mask.shape[-1]
        mask = mask.unsqueeze(-3).expand(*lead, heads // kv_heads, length, seen).reshape(*lead, -1, seen)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask)
    return out.view(batch, heads, length, head_dim)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with `kv_heads` key/value heads (fewer than `heads`: grouped-query attention); with a KV
    cache attached (`cache`), new tokens attend to every cached one."""

    def __init__(self, dim: int, heads: int, bias: bool = True, kv_heads: Optional[int] = None):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads or heads
        self.head_dim = dim // heads
        kv_dim = self.kv_heads * self.head_dim
        self.qkv = nn.Linear(dim, dim + 2 * kv_dim, bias=bias)  # one product for queries, keys and values
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.cache = None  # a DynamicKVCache or StaticKVCache (perflab/models/kv_cache.py) while generating

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None, rotary: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> torch.Tensor:
        """`positions`: where the new tokens sit, given only to read and write the attached cache; `mask`: which
        cached positions each new token sees (None: causal among the new tokens, all cached ones); `rotary`: the
        new tokens' (cos, sin) rows when positions are rotary embeddings."""
        batch, length, dim = x.shape
        kv_dim = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((dim, kv_dim, kv_dim), dim=2)
        q = q.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if positions is not None and self.cache is not None:
            k, v = self.cache.update(positions, k, v)
        attended = attend(q, k, v, mask)
        return self.proj(attended.transpose(1, 2).reshape(batch, length, dim))


class RMSNorm(nn.Module):
    """x / rms(x) x weight, computed in fp32 whatever the stored dtype (as transformers' LlamaRMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        return self.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), the gate and up projections as one product."""

    def __init__(self, dim: int, hidden: int, bias: bool = True):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x)); `family` picks the norm and MLP."""

    def __init__(self, dim: int, heads: int, bias: bool = True, kv_heads: Optional[int] = None,
                 ffn_dim: Optional[int] = None, family: str = "gpt", norm_eps: float = 1e-5):
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"block family must be one of {FAMILIES}, got {family!r}")
        hidden = ffn_dim or 4 * dim
        llama = family == "llama"
        self.norm1 = RMSNorm(dim, norm_eps) if llama else nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, bias, kv_heads)
        self.norm2 = RMSNorm(dim, norm_eps) if llama else nn.LayerNorm(dim)
        self.mlp = (SwiGLU(dim, hidden, bias) if llama else
                    nn.Sequential(nn.Linear(dim, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, dim, bias=bias)))

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None, rotary: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                ) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), positions, mask, rotary)
        return x + self.mlp(self.norm2(x))

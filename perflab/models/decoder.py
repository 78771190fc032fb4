"""The built-in decoder for generation: the shared block (perflab/models/gpt.py, GPT or Llama family) with a
pluggable KV cache.

`Decoder(tokens)` is the full forward (every position, no cache). `Decoder(tokens, positions, mask)` with caches
attached (`attach_caches`) runs only the new tokens and attends to everything cached. Sizes: SIZES (GPT-2-like
shapes and the shapes of Llama-3.2-1B and Llama-3-8B), and the smaller, separately trained speculative drafts of
the GPT sizes: DRAFT_SIZES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from perflab.models.kv_cache import DynamicKVCache, StaticKVCache
from perflab.models.gpt import Block, RMSNorm, rotary_tables


@dataclass(frozen=True)
class DecoderSize:
    """The shape of a decoder. family "gpt": LayerNorm, GELU MLP, a learned position table; "llama": RMSNorm,
    SwiGLU MLP, rotary positions (rope_theta). kv_heads below heads: grouped-query attention (default: heads);
    ffn_dim default 4 x dim; tied: the output head shares the token embedding's weight."""

    layers: int
    dim: int
    heads: int
    vocab: int
    max_seq: int
    kv_heads: int = 0
    ffn_dim: int = 0
    family: str = "gpt"
    rope_theta: float = 10000.0
    tied: bool = True
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_heads", self.kv_heads or self.heads)
        object.__setattr__(self, "ffn_dim", self.ffn_dim or 4 * self.dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def rotary(self) -> bool:
        return self.family == "llama"


# Parameters: tiny 0.1M, 125m ~110M, 350m ~335M, 1b ~1.07B (GELU MLP 4x, tied input/output embedding).
# The llama sizes are the published shapes with random weights and plain RoPE (no Llama-3.1 frequency scaling; it
# changes no byte or FLOP): llama-1b is Llama-3.2-1B (1.236B parameters, output head tied to the embedding, as the
# real one), llama-8b is Llama-3-8B (8.03B, untied head); llama-tiny (untied, 2 query heads per key/value head) is
# for CPU tests. max_seq 8192 (Llama-3-8B's context; Llama-3.2-1B's is longer, which only sizes the RoPE table).
LLAMA3 = {"vocab": 128256, "max_seq": 8192, "family": "llama", "rope_theta": 500000.0}
SIZES = {
    "tiny": DecoderSize(layers=2, dim=64, heads=4, vocab=512, max_seq=256),
    "125m": DecoderSize(layers=12, dim=768, heads=12, vocab=32000, max_seq=2048),
    "350m": DecoderSize(layers=24, dim=1024, heads=16, vocab=32000, max_seq=2048),
    "1b": DecoderSize(layers=20, dim=2048, heads=16, vocab=32000, max_seq=2048),
    "llama-tiny": DecoderSize(layers=2, dim=64, heads=4, kv_heads=2, ffn_dim=160, vocab=512, max_seq=256,
                              family="llama", tied=False),
    "llama-1b": DecoderSize(layers=16, dim=2048, heads=32, kv_heads=8, ffn_dim=8192, **LLAMA3),
    "llama-8b": DecoderSize(layers=32, dim=4096, heads=32, kv_heads=8, ffn_dim=14336, tied=False, **LLAMA3),
}
# The built-in drafts: same vocabulary and context, a fraction of the layers and width.
DRAFT_SIZES = {
    "tiny": DecoderSize(layers=1, dim=32, heads=2, vocab=512, max_seq=256),
    "125m": DecoderSize(layers=2, dim=256, heads=4, vocab=32000, max_seq=2048),
    "350m": DecoderSize(layers=3, dim=384, heads=6, vocab=32000, max_seq=2048),
    "1b": DecoderSize(layers=4, dim=512, heads=8, vocab=32000, max_seq=2048),
}


class Decoder(nn.Module):
    """Token embedding (+ a learned position table, or rotary positions in the blocks), pre-norm blocks, final norm,
    output projection (tied to the token embedding unless the size says otherwise). No biases."""

    def __init__(self, size: DecoderSize):
        super().__init__()
        self.size = size
        self.token_embedding = nn.Embedding(size.vocab, size.dim)
        self.position_embedding = None if size.rotary else nn.Embedding(size.max_seq, size.dim)
        self.blocks = nn.ModuleList(Block(size.dim, size.heads, bias=False, kv_heads=size.kv_heads,
                                          ffn_dim=size.ffn_dim, family=size.family, norm_eps=size.norm_eps)
                                    for _ in range(size.layers))
        self.norm = RMSNorm(size.dim, size.norm_eps) if size.rotary else nn.LayerNorm(size.dim)
        self.head = nn.Linear(size.dim, size.vocab, bias=False)
        if size.tied:
            self.head.weight = self.token_embedding.weight
        self.register_buffer("static_mask_rows", None, persistent=False)  # set with static caches
        # rotary angles of every position: tables, not weights (stored in the model's dtype, as transformers does)
        cos, sin = rotary_tables(size.max_seq, size.head_dim, size.rope_theta) if size.rotary else (None, None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(_init_weights)

    @property
    def vocab_size(self) -> int:
        return self.size.vocab

    def forward(self, tokens: torch.Tensor, positions: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (batch, T, vocab) for `tokens` at `positions` through the attached caches; without positions,
        the full forward over positions 0..T-1 (caches untouched)."""
        cache_positions = positions  # the blocks use their caches only when given the new tokens' positions
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens)
        rotary = None
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions)
        else:
            rotary = (self.rope_cos[positions], self.rope_sin[positions])
        for block in self.blocks:
            x = block(x, cache_positions, mask, rotary)
        return self.head(self.norm(x))

    def attach_caches(self, static: bool, batch: int = 0, max_seq: int = 0, dtype: Optional[torch.dtype] = None,
                      device: Optional[torch.device] = None) -> None:
        """Give every attention layer a KV cache (static: pre-allocated for `batch` x `max_seq`, with the mask rows
        of each query position: a buffer, so a compiled step reads it in place)."""
        if static:
            rows = torch.ones(max_seq, max_seq, dtype=torch.bool, device=device).tril()
            self.static_mask_rows = rows
        for block in self.blocks:
            if static:
                block.attention.cache = StaticKVCache(batch, self.size.kv_heads, max_seq, self.size.head_dim,
                                                      dtype, device)
            else:
                block.attention.cache = DynamicKVCache()

    def caches(self) -> list:
        return [block.attention.cache for block in self.blocks]

    def detach_caches(self) -> None:
        for block in self.blocks:
            block.attention.cache = None
        self.static_mask_rows = None


def _init_weights(module: nn.Module) -> None:
    # GPT-2's initialisation: small normal weights keep the random model's logits finite and spread out.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)

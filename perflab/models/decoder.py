"""The built-in GPT-style decoder for generation: the shared GPT block (perflab/models/gpt.py) with a pluggable KV
cache.

`Decoder(tokens)` is the full forward (every position, no cache). `Decoder(tokens, positions, mask)` with caches
attached (`attach_caches`) runs only the new tokens and attends to everything cached. Sizes: SIZES, and the
smaller, separately trained speculative drafts: DRAFT_SIZES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from perflab.models.kv_cache import DynamicKVCache, StaticKVCache
from perflab.models.gpt import Block


@dataclass(frozen=True)
class DecoderSize:
    """The shape of a decoder."""

    layers: int
    dim: int
    heads: int
    vocab: int
    max_seq: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# Parameters: tiny 0.1M, 125m ~110M, 350m ~335M, 1b ~1.07B (GELU MLP 4x, tied input/output embedding).
SIZES = {
    "tiny": DecoderSize(layers=2, dim=64, heads=4, vocab=512, max_seq=256),
    "125m": DecoderSize(layers=12, dim=768, heads=12, vocab=32000, max_seq=2048),
    "350m": DecoderSize(layers=24, dim=1024, heads=16, vocab=32000, max_seq=2048),
    "1b": DecoderSize(layers=20, dim=2048, heads=16, vocab=32000, max_seq=2048),
}
# The built-in drafts: same vocabulary and context, a fraction of the layers and width.
DRAFT_SIZES = {
    "tiny": DecoderSize(layers=1, dim=32, heads=2, vocab=512, max_seq=256),
    "125m": DecoderSize(layers=2, dim=256, heads=4, vocab=32000, max_seq=2048),
    "350m": DecoderSize(layers=3, dim=384, heads=6, vocab=32000, max_seq=2048),
    "1b": DecoderSize(layers=4, dim=512, heads=8, vocab=32000, max_seq=2048),
}


class Decoder(nn.Module):
    """Token + position embeddings, pre-norm blocks, final norm, output projection tied to the token embedding."""

    def __init__(self, size: DecoderSize):
        super().__init__()
        self.size = size
        self.token_embedding = nn.Embedding(size.vocab, size.dim)
        self.position_embedding = nn.Embedding(size.max_seq, size.dim)
        self.blocks = nn.ModuleList(Block(size.dim, size.heads, bias=False) for _ in range(size.layers))
        self.norm = nn.LayerNorm(size.dim)
        self.head = nn.Linear(size.dim, size.vocab, bias=False)
        self.head.weight = self.token_embedding.weight
        self.register_buffer("static_mask_rows", None, persistent=False)  # set with static caches
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
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x, cache_positions, mask)
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
                block.attention.cache = StaticKVCache(batch, self.size.heads, max_seq, self.size.head_dim,
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

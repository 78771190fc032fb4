"""KV caches for the built-in decoder: a dynamic one that grows every token, and a static one allocated once.

The static cache holds `max_seq` positions from the start and is written in place at the positions being
decoded; attention reads the whole buffer under a mask. Its shapes never change, so torch.compile can
capture the decode step (and CUDA graphs replay it). The dynamic cache concatenates, so its shapes grow.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class DynamicKVCache:
    """Keys and values of the tokens seen so far, grown by concatenation."""

    def __init__(self) -> None:
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    def update(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (batch, heads, T, head_dim) keys and values; return everything cached."""
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
        self.keys, self.values = keys, values
        return keys, values

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (speculative decoding's rejected drafts)."""
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    def reset(self) -> None:
        self.keys = self.values = None


class StaticKVCache(nn.Module):
    """Pre-allocated (batch, heads, max_seq, head_dim) buffers, written in place at the given positions.

    Buffers (not plain attributes), so torch.compile treats them as static state it may mutate.
    """

    def __init__(self, batch: int, heads: int, max_seq: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        shape = (batch, heads, max_seq, head_dim)
        self.register_buffer("keys", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("values", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys and values at `positions`; return the whole buffers (the caller masks what is unwritten)."""
        self.keys.index_copy_(2, positions, keys.to(self.keys.dtype))
        self.values.index_copy_(2, positions, values.to(self.values.dtype))
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        """Nothing to do: positions past the session's length are masked, and overwritten when reached."""

    def reset(self) -> None:
        """Nothing to do: stale entries are masked until a new request overwrites them."""


def kv_cache_bytes(layers: int, batch: int, kv_heads: int, head_dim: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values for `length` positions: what one decode step at that length must read."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * batch * kv_heads * head_dim * length * element

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
        """Append (batch, kv_heads, T, head_dim) keys and values; return everything cached."""
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
    """Pre-allocated keys and values in one (2, batch, kv_heads, max_seq, head_dim) buffer, written in place at the
    given positions by one index_copy: in a compiled decode step one kernel per layer writes both (on the H100, a
    1b step ran 224 kernels instead of 244 with separate key and value buffers, each write about 1.1 us).

    A buffer (not a plain attribute), so torch.compile treats it as static state it may mutate.
    """

    def __init__(self, batch: int, kv_heads: int, max_seq: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        # only the key/value heads: with grouped-query attention, heads/kv_heads times less than one per query head
        shape = (2, batch, kv_heads, max_seq, head_dim)
        self.register_buffer("kv", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def keys(self) -> torch.Tensor:
        return self.kv[0]

    @property
    def values(self) -> torch.Tensor:
        return self.kv[1]

    def update(self, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys and values at `positions`; return the whole buffers (the caller masks what is unwritten)."""
        self.kv.index_copy_(3, positions, torch.stack((keys, values)).to(self.kv.dtype))
        return self.kv[0], self.kv[1]

    def truncate(self, length: int) -> None:
        """Nothing to do: positions past the session's length are masked, and overwritten when reached."""

    def reset(self) -> None:
        """Nothing to do: stale entries are masked until a new request overwrites them."""


def kv_cache_bytes(layers: int, batch: int, kv_heads: int, head_dim: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values for `length` positions: what one decode step at that length must read."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * batch * kv_heads * head_dim * length * element

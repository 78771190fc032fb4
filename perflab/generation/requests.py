"""Requests: prompts from the synthetic language, with prompt and output lengths drawn from distributions.

A length option is one number (`128`) or a uniform range (`64-256`). A request batch shares one prompt length
and one output length (those of its first request): the collate function cuts every prompt to it.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from perflab.errors import PerflabError
from perflab.generation.corpus import SyntheticLanguage


def parse_lengths(text: str, name: str) -> tuple[int, int]:
    """'128' -> (128, 128); '64-256' -> (64, 256)."""
    low, sep, high = str(text).partition("-")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise PerflabError(f"--option {name} expects a number or a range like 64-256, got {text!r}") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise PerflabError(f"--option {name}: lengths must be positive and the range low-high ascending, got {text!r}")
    return bounds


class Requests(Dataset):
    """Item i: (prompt tokens at the longest prompt length, (prompt length, output length))."""

    def __init__(self, vocab: int, prompt_lengths: tuple[int, int], output_lengths: tuple[int, int], seed: int,
                 pool: int = 64, length: int = 100_000):
        gen = torch.Generator().manual_seed(seed)
        self.prompts = SyntheticLanguage(vocab).sample(pool, prompt_lengths[1], seed=seed + 7)
        # Python ints: reading a length must not show up as a tensor .item() in a profile
        self.prompt_len = torch.randint(prompt_lengths[0], prompt_lengths[1] + 1, (pool,), generator=gen).tolist()
        self.output_len = torch.randint(output_lengths[0], output_lengths[1] + 1, (pool,), generator=gen).tolist()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, tuple[int, int]]:
        row = index % len(self.prompts)
        return self.prompts[row], (self.prompt_len[row], self.output_len[row])


def collate_requests(items: list[tuple[torch.Tensor, tuple[int, int]]]) -> tuple[torch.Tensor, int]:
    """(prompts (batch, L), output length) with L and the output length of the first request."""
    prompt_len, output_len = items[0][1]
    return torch.stack([tokens[:prompt_len] for tokens, _ in items]), output_len


def request_shape(batch: Any) -> tuple[torch.Tensor, int]:
    """The (prompts, output length) of a request batch."""
    prompt, output_len = batch
    return prompt, int(output_len)

"""transformer: a small GPT-style decoder for attention kernels, activation checkpointing and sequence length.

Its blocks are the GPT block generation uses too (perflab/models/gpt.py): causal self-attention goes through
F.scaled_dot_product_attention, so `--sdpa flash|efficient|math` picks its kernel. Each block can be
checkpointed (`--activation-checkpointing`: recompute its activations in backward instead of storing them). Options: seq_len, layers, dim, heads, vocab,
and size: a preset of the shared decoder's sizes (perflab/models/decoder.py), e.g. size=1b (20 blocks of width 2048,
16 heads, vocabulary 32k, 2048 tokens: ~1.1B parameters, a step long enough for communication to hide behind);
the other options, when given, override the preset's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset

from perflab.errors import PerflabError
from perflab.models.decoder import SIZES
from perflab.models.gpt import Block
from perflab.workloads.base import Workload
from perflab.workloads.settings import ByDevice, resolve_settings, setting

DESCRIPTION = "GPT-style decoder, causal SDPA attention, checkpointable blocks; option seq_len"
DEFAULT_BATCH = {"cpu": 4, "cuda": 16}


class GPT(nn.Module):
    """Token + position embeddings, `layers` blocks, final norm, tied output projection to the vocabulary."""

    def __init__(self, vocab: int, seq_len: int, layers: int, dim: int, heads: int,
                 activation_checkpointing: bool = False):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position_embedding = nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.token_embedding.weight
        self.activation_checkpointing = activation_checkpointing

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.head(self.norm(x))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every position's prediction of the next token."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class TokenSequences(Dataset):
    """Token sequences from a fixed random bigram table (learnable structure, not uniform noise).

    Item i is (tokens[0:L], tokens[1:L+1]) of sequence i modulo a pool drawn once from the seed.
    """

    def __init__(self, pool: int, seq_len: int, vocab: int, seed: int, length: int = 100_000):
        gen = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, vocab, (vocab, 4), generator=gen)  # each token has 4 likely successors
        tokens = torch.empty(pool, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (pool,), generator=gen)
        choices = torch.randint(0, 4, (pool, seq_len), generator=gen)
        for t in range(seq_len):
            tokens[:, t + 1] = successors[tokens[:, t], choices[:, t]]
        self.tokens = tokens
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        sequence = self.tokens[index % len(self.tokens)]
        return sequence[:-1], sequence[1:]


OPTIONS = (
    setting("seq_len", int, "tokens per sequence", ByDevice(1024, 64), minimum=2),
    setting("layers", int, "decoder blocks", ByDevice(6, 2), minimum=1),
    setting("dim", int, "model width (a multiple of heads)", ByDevice(512, 64), minimum=1),
    setting("heads", int, "attention heads", ByDevice(8, 4), minimum=1),
    setting("vocab", int, "vocabulary size", ByDevice(8192, 512), minimum=2),
    setting("size", str, "a preset of the shared decoder's sizes (layers, dim, heads, vocab, seq_len); 1b is ~1.1B "
            "parameters for sharding (use --batch 4 or less per GPU, bf16); the options above override it",
            choices=tuple(SIZES)),
)
PRESET_KEYS = ("seq_len", "layers", "dim", "heads", "vocab")


def preset_settings(given: dict, size_name) -> dict:
    """The given settings over the preset's shape (SIZES[size]); without a size, the given settings."""
    if size_name is None:
        return dict(given)
    size = SIZES[size_name]
    preset = {"seq_len": size.max_seq, "layers": size.layers, "dim": size.dim, "heads": size.heads,
              "vocab": size.vocab}
    return {**preset, **{key: value for key, value in given.items() if key in PRESET_KEYS}}


def build(cfg) -> Workload:
    given = cfg.workload_options
    opts = resolve_settings(OPTIONS, preset_settings(given, given.get("size")), cfg.device)
    seq_len, layers, dim, heads, vocab = (opts[key] for key in ("seq_len", "layers", "dim", "heads", "vocab"))
    if dim % heads:
        raise PerflabError(f"transformer: dim ({dim}) must be a multiple of heads ({heads})")
    model = GPT(vocab, seq_len, layers, dim, heads, activation_checkpointing=cfg.activation_checkpointing)
    return Workload(
        name="transformer",
        model=model,
        dataset=TokenSequences(pool=256, seq_len=seq_len, vocab=vocab, seed=cfg.seed),
        loss_fn=next_token_loss,
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=3e-4),
        description=DESCRIPTION,
        supports_activation_checkpointing=True,
        uses_attention=True,
        default_data="device",
        info={"size": given.get("size"), "seq_len": seq_len, "layers": layers, "dim": dim, "heads": heads, "vocab": vocab,
              "activation_checkpointing": cfg.activation_checkpointing},
    )

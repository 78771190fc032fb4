"""Bags of embeddings pooled by hand: embedding lookups of many tokens, summed into their bags with index_add. The
embedding's backward scatters into the table (atomics on CUDA) and index_add's forward scatters too. The fix
(workload option fixed=1): nn.EmbeddingBag(mode="sum") over the same table and offsets."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from perflab import Workload
from planted_common import size


class PooledEmbedding(nn.Module):
    def __init__(self, vocab: int, width: int, bag: int, fixed: bool = False):
        super().__init__()
        self.bag, self.fixed = bag, fixed  # fixed=1: the expert's EmbeddingBag
        self.table = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, 1)

    def forward(self, tokens):
        batch = tokens.shape[0]
        flat = tokens.reshape(-1)
        if self.fixed:
            offsets = torch.arange(0, flat.numel(), self.bag, device=flat.device)
            pooled = F.embedding_bag(flat, self.table.weight, offsets, mode="sum")
        else:
            bag_of = torch.arange(batch, device=flat.device).repeat_interleave(self.bag)
            rows = self.table(flat)  # the planted gather: its backward scatters into the table
            pooled = torch.zeros(batch, rows.shape[1], device=rows.device).index_add(0, bag_of, rows)
        return self.head(pooled)


class TokenBags(Dataset):
    def __init__(self, length: int, bag: int, vocab: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (length, bag), generator=gen)
        self.targets = torch.randn(length, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int):
        return self.tokens[index], self.targets[index]


def build(cfg) -> Workload:
    bag = size(cfg, cpu=256, cuda=2048)
    vocab, width = (1000, 64) if cfg.device != "cuda" else (100_000, 256)
    model = PooledEmbedding(vocab, width, bag, fixed=bool(int(cfg.workload_options.get("fixed", 0))))
    return Workload(name="planted-index-add-scatter", model=model,
                    dataset=TokenBags(max(cfg.batch_size, 8), bag, vocab, cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: embedding bags pooled by hand with index_add")

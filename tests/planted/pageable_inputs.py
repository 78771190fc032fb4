"""Host-to-device copies: giant pageable input batches and a tiny model (run with --no-pin-memory)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from perflab import Workload
from planted_common import size


class Indices(Dataset):
    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> int:
        return index


class FixedBatch:
    """collate_fn that hands out one pre-made batch: no per-item or stacking work, only the copy remains."""

    def __init__(self, batch: int, res: int, seed: int, compact: bool = False):
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(batch, 3, res, res, generator=gen)
        if compact:  # workload option fixed=1: uint8 images, converted on the GPU (the advice applied)
            self.inputs = (self.inputs * 32 + 128).clamp(0, 255).to(torch.uint8)
        self.targets = torch.randn(batch, 10, generator=gen)

    def __call__(self, indices):
        return self.inputs, self.targets


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 10)

    def forward(self, x):
        return self.head(x.float().mean(dim=(2, 3)))


def build(cfg) -> Workload:
    res = size(cfg, cpu=64, cuda=512)
    return Workload(name="planted-pageable-inputs", model=Tiny(), dataset=Indices(), loss_fn=nn.MSELoss(),
                    collate_fn=FixedBatch(cfg.batch_size, res, cfg.seed, bool(cfg.workload_options.get("fixed"))),
                    description="planted: giant pageable inputs, tiny model")

"""Input pipeline: every item costs the loader time (sleep, or heavy CPU work); the model is tiny."""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

from perflab import Workload


class SlowItems(Dataset):
    def __init__(self, work: str, item_ms: float, features: int = 64, length: int = 512):
        self.work, self.item_ms, self.features, self.length = work, item_ms, features, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        gen = torch.Generator().manual_seed(index)
        if self.work == "sleep":
            time.sleep(self.item_ms / 1e3)
        else:  # heavy per-item CPU work: repeated FFTs of an image-sized array
            image = torch.randn(128, 128, generator=gen)
            began = time.perf_counter()
            while (time.perf_counter() - began) * 1e3 < self.item_ms:
                image = torch.fft.ifft2(torch.fft.fft2(image)).real
        return torch.randn(self.features, generator=gen), torch.randn(10, generator=gen)


def build(cfg) -> Workload:
    opts = cfg.workload_options
    return Workload(name="planted-slow-loader", model=nn.Linear(64, 10),
                    dataset=SlowItems(opts.get("work", "sleep"), float(opts.get("item_ms", 1.0))),
                    loss_fn=nn.MSELoss(), description="planted: the data loader sleeps or computes per item")

"""Allocator churn: a per-process memory fraction a little under what the step's two allocation pools cache.

The caching allocator keeps blocks under 1 MB (small pool) and larger ones (large pool) apart. A step that first
makes many small blocks (per-sample work) and then large ones (batched layers) needs both pools' segments; under
torch.cuda.set_per_process_memory_fraction just below their sum, each phase's allocation fails, the allocator
frees every cached block of the other (cudaFree, which waits for the device) and allocates again (cudaMalloc),
step after step.
"""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, on_cuda, size


class NormalisedPerSample(nn.Module):
    """Normalises each sample on its own (many blocks under 1 MB: the small pool), then batched layers (blocks of
    tens of MB: the large pool). The two pools never share blocks, so under a tight limit each phase makes the
    allocator free what the other cached."""

    def __init__(self, width: int, tight: bool = False, layers: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.tight = tight
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.tight and x.is_cuda and self.calls == 1:  # the peak of this process's steps, not of its past
            torch.cuda.reset_peak_memory_stats(x.device)
        if self.tight and x.is_cuda and self.calls == 3:  # after two calls: at least one whole step
            limit_between_pools(x.device)
        with torch.no_grad():  # input normalisation, one sample at a time, as a per-item transform would
            x = torch.stack([(sample - sample.mean(dim=0)) / (sample.std(dim=0) + 1e-5) for sample in x])
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.mean(dim=1)


def limit_between_pools(device: torch.device) -> None:
    """Cap the process between the step's peak of live memory and what its two pools cache: half the small pool
    below their sum. Measured from the first step in this process rather than fixed per sample, so the limit is
    tight whatever the card, the batch or what the process allocated before (a bench running many cases in one
    process ran out of memory under a fixed budget)."""
    stats = torch.cuda.memory_stats(device)
    reserved = stats["reserved_bytes.all.current"]
    small = stats["reserved_bytes.small_pool.current"]
    peak = stats["allocated_bytes.all.peak"]
    limit = max(reserved - small // 2, peak + 2 * 2**20)
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / torch.cuda.get_device_properties(device).total_memory),
                                               device)


def build(cfg) -> Workload:
    width = size(cfg, cpu=64, cuda=512)
    positions = int(cfg.workload_options.get("positions", 256 if on_cuda(cfg) else 16))
    # At batch 64 (width 512, 256 positions; torch 2.11 on an H200) the step cached 48 MB of small blocks and
    # 416 MB of large ones, and churned under limits 40-64 MB below their sum. fixed=1: no limit (the advice applied).
    tight = not cfg.workload_options.get("fixed") and on_cuda(cfg)
    model = NormalisedPerSample(width, tight)
    return Workload(name="planted-memory-fraction", model=model,
                    dataset=RandomItems(64, (positions, width), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: a tight memory fraction over two allocator pools")

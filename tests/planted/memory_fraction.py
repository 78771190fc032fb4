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

    def __init__(self, width: int, budget_mb_per_sample: float = 0.0, layers: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.budget_mb_per_sample = budget_mb_per_sample  # 0: no limit

    def forward(self, x):
        if self.budget_mb_per_sample and x.is_cuda:
            limit_once(x, self.budget_mb_per_sample)
            self.budget_mb_per_sample = 0.0
        with torch.no_grad():  # input normalisation, one sample at a time, as a per-item transform would
            x = torch.stack([(sample - sample.mean(dim=0)) / (sample.std(dim=0) + 1e-5) for sample in x])
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.mean(dim=1)


def limit_once(x: torch.Tensor, budget_mb_per_sample: float) -> None:
    """Cap the process at what is allocated now (weights, staged batches) plus the step's budget, as a fraction."""
    total = torch.cuda.get_device_properties(x.device).total_memory
    limit = torch.cuda.memory_allocated(x.device) + budget_mb_per_sample * len(x) * 2**20
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), x.device)


def build(cfg) -> Workload:
    width = size(cfg, cpu=64, cuda=512)
    positions = int(cfg.workload_options.get("positions", 256 if on_cuda(cfg) else 16))
    # At batch 64 (width 512, 256 positions; torch 2.11 on an H200) the step cached 48 MB of small blocks and
    # 416 MB of large ones, and churned under limits 40-64 MB below their sum: about 5.6 MB per sample over what
    # is allocated before the first step. fixed=1: no limit (the advice applied).
    fixed = bool(cfg.workload_options.get("fixed"))
    budget = 0.0 if fixed else float(cfg.workload_options.get("budget_mb_per_sample", 5.6))
    model = NormalisedPerSample(width, budget if on_cuda(cfg) else 0.0)
    return Workload(name="planted-memory-fraction", model=model,
                    dataset=RandomItems(64, (positions, width), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: a tight memory fraction over two allocator pools")

"""A full sort to take the k best scores: every row of a wide score matrix is sorted, then the first k kept. The
sort (and its backward, a scatter) is the hot spot. The fix (workload option fixed=1): torch.topk(scores, k)."""
from __future__ import annotations

import torch
from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


class TopScores(nn.Module):
    def __init__(self, width: int, candidates: int, k: int, fixed: bool = False):
        super().__init__()
        self.k, self.fixed = k, fixed  # fixed=1: the expert's topk
        self.score = nn.Linear(width, candidates)
        self.head = nn.Linear(k, width)

    def forward(self, x):
        scores = self.score(x)
        if self.fixed:
            best = torch.topk(scores, self.k, dim=-1).values
        else:
            best = torch.sort(scores, dim=-1, descending=True).values[:, : self.k]  # the planted full sort
        return self.head(best)


def build(cfg) -> Workload:
    candidates = size(cfg, cpu=4096, cuda=65536)
    width = 16 if cfg.device != "cuda" else 128
    model = TopScores(width, candidates, k=8, fixed=bool(int(cfg.workload_options.get("fixed", 0))))
    return Workload(name="planted-sort-topk", model=model,
                    dataset=RandomItems(max(cfg.batch_size, 64), (width,), (width,), cfg.seed), loss_fn=nn.MSELoss(),
                    default_data="device", description="planted: a full sort to take the k best scores")

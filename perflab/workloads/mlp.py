"""mlp: a two-layer network (1024 -> 512 -> 10); the smallest workload."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from perflab.workloads.base import Workload
from perflab.workloads.settings import resolve_settings, setting

DESCRIPTION = "Two-layer MLP 1024->512->10; tiny, for tests and CPU demos"
DEFAULT_BATCH = {"cpu": 64, "cuda": 256}


class SimpleNet(nn.Module):
    def __init__(self, in_features: int = 1024, hidden: int = 512, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class RandomVectors(Dataset):
    """Gaussian feature vectors with class labels, drawn once from a fixed seed."""

    def __init__(self, size: int, in_features: int, classes: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(size, in_features, generator=gen)
        self.targets = torch.randint(0, classes, (size,), generator=gen)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]


OPTIONS = (
    setting("in_features", int, "input features", 1024, minimum=1),
    setting("hidden", int, "hidden units", 512, minimum=1),
    setting("classes", int, "output classes", 10, minimum=2),
)


def build(cfg) -> Workload:
    opts = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    in_features, hidden, classes = opts["in_features"], opts["hidden"], opts["classes"]
    return Workload(
        name="mlp",
        model=SimpleNet(in_features, hidden, classes),
        dataset=RandomVectors(4096, in_features, classes, cfg.seed),
        loss_fn=nn.CrossEntropyLoss(),
        description=DESCRIPTION,
        is_classifier=True,
        info={"in_features": in_features, "hidden": hidden, "classes": classes},
    )

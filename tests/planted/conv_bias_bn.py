"""Conv with a bias followed by batch norm (the norm's mean subtraction cancels the bias): wasted work."""
from __future__ import annotations

from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    res = size(cfg, cpu=16, cuda=64)
    fixed = bool(cfg.workload_options.get("fixed"))  # the advice applied: bias=False before batch norm
    layers = []
    for _ in range(4):
        layers += [nn.Conv2d(32, 32, 3, padding=1, bias=not fixed), nn.BatchNorm2d(32), nn.ReLU()]
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=not fixed), nn.BatchNorm2d(32), nn.ReLU(), *layers,
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return Workload(name="planted-conv-bias-bn", model=model, dataset=RandomItems(64, (3, res, res), (10,), cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device", description="planted: conv bias before batch norm")

"""FP32 matmuls with TF32 off (run with --precision fp32): tensor cores unused."""
from __future__ import annotations

from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    width = size(cfg, cpu=256, cuda=4096)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
    return Workload(name="planted-fp32-matmul", model=model, dataset=RandomItems(max(cfg.batch_size, 64), (width,),
                    (width,), cfg.seed), loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: fp32 matmuls with TF32 off")

"""16-bit matmuls whose dims are not multiples of 8 (run with --precision bf16): tensor cores padded per call."""
from __future__ import annotations

from torch import nn

from perflab import Workload
from planted_common import RandomItems, size


def build(cfg) -> Workload:
    width = size(cfg, cpu=250, cuda=4099)
    if cfg.workload_options.get("fixed"):  # the advice applied: padded to a multiple of 8
        width = -(-width // 8) * 8
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
    return Workload(name="planted-odd-dims", model=model, dataset=RandomItems(max(cfg.batch_size, 64), (width,),
                    (width,), cfg.seed), loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: matmul dims not a multiple of 8 in 16-bit")

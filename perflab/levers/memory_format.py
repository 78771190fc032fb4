"""--channels-last: NHWC layout for the model's convolutions and 4-D inputs."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from perflab.bottlenecks import COMPUTE_BOUND, CONVOLUTIONS, MEMORY_BANDWIDTH
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints


def _refuse_without_convs(cfg, workload, device) -> Optional[str]:
    if not any(isinstance(module, nn.Conv2d) for module in workload.model.modules()):
        return f"{workload.name} has no 2-D convolutions, so the memory layout does not matter"
    return None


def _apply(plan, cfg) -> None:
    plan.memory_format = torch.channels_last
    plan.model.to(memory_format=torch.channels_last)


LEVERS = [
    Lever("channels-last", "channels_last", True, "NHWC memory layout for convolutions (tensor-core friendly)",
          "a model with Conv2d layers",
          (Address(MEMORY_BANDWIDTH, 2, CONVOLUTIONS), Address(COMPUTE_BOUND, 4, CONVOLUTIONS)), 30, _apply,
          in_code="model.to(memory_format=torch.channels_last), and the same for the image inputs",
          when_lost="channels-last lost: these convolutions are fastest in NCHW; keep it",
          tune=TuneHints(ONE_TRIAL, screen_always=3), checks=_refuse_without_convs),
]

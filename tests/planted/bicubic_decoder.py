"""Bicubic upsampling: a conv decoder that upsamples with F.interpolate(mode="bicubic"), twice between its convs and
once to the output size (as segmentation heads upsample their logits). The op is the hot spot (on CUDA its backward
scatters its gradients with atomics); the fix (workload option fixed=1) upsamples bilinearly."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from perflab import Workload
from planted_common import RandomItems, size


class Decoder(nn.Module):
    def __init__(self, channels: int, classes: int, fixed: bool = False):
        super().__init__()
        self.mode = "bilinear" if fixed else "bicubic"  # fixed=1: the expert's fix, to measure what it gains
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in range(2))
        self.head = nn.Conv2d(channels, classes, 1)

    def upsample(self, x, scale: int):
        return F.interpolate(x, scale_factor=scale, mode=self.mode, align_corners=False)  # the planted bicubic

    def forward(self, x):
        for conv in self.convs:
            x = self.upsample(torch.relu(conv(x)), 2)
        return self.upsample(self.head(x), 4)


def build(cfg) -> Workload:
    side = size(cfg, cpu=8, cuda=32)
    channels, classes = (8, 8) if cfg.device != "cuda" else (64, 32)
    out_side = side * 16
    return Workload(name="planted-bicubic-decoder",
                    model=Decoder(channels, classes, fixed=bool(int(cfg.workload_options.get("fixed", 0)))),
                    dataset=RandomItems(max(cfg.batch_size, 8), (channels, side, side), (classes, out_side, out_side),
                                        cfg.seed),
                    loss_fn=nn.MSELoss(), default_data="device",
                    description="planted: a conv decoder upsampling with bicubic interpolation")

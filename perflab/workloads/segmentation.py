"""segmentation: frozen pre-trained-style CNN encoder + trainable decoder, per-pixel labels.

The encoder is frozen (requires_grad False, always in eval mode) and only the decoder trains, so the
encoder of batch N+1 can run on its own CUDA stream while the decoder trains on batch N
(`--pipeline streams`). Images arrive as uint8; the encoder's first layer converts and normalises them,
so the host-to-device copy moves a quarter of the bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from perflab.errors import PerflabError
from perflab.workloads.base import Workload
from perflab.workloads.settings import ByDevice, resolve_settings, setting

DESCRIPTION = "frozen CNN encoder + trainable decoder, per-pixel labels; --pipeline streams"
DEFAULT_BATCH = {"cpu": 4, "cuda": 8}


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class ToUnitFloat(nn.Module):
    """uint8 [0, 255] images -> float in [-1, 1]."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.float().mul_(2 / 255).sub_(1)


class Encoder(nn.Module):
    """Four stages, each halving the resolution: features at 1/16 of the input with 8x `width` channels."""

    def __init__(self, width: int):
        super().__init__()
        widths = [width, 2 * width, 4 * width, 8 * width]
        layers: list[nn.Module] = [ToUnitFloat()]
        c_in = 3
        for c_out in widths:
            layers += [_conv(c_in, c_out, stride=2), _conv(c_out, c_out)]
            c_in = c_out
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


class Decoder(nn.Module):
    """Four 2x transposed-conv upsamplings back to full resolution, then per-pixel class logits."""

    def __init__(self, width: int, classes: int):
        super().__init__()
        widths = [8 * width, 4 * width, 2 * width, width, width]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths, widths[1:]):
            layers += [nn.ConvTranspose2d(c_in, c_out, 2, stride=2, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(width, classes, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)


class SegmentationModel(nn.Module):
    """decoder(encoder(x)); the encoder stays frozen and in eval mode whatever `train()` is asked."""

    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder = encoder.requires_grad_(False)
        self.decoder = decoder

    def train(self, mode: bool = True) -> "SegmentationModel":
        super().train(mode)
        self.encoder.eval()  # frozen: BatchNorm keeps its running statistics
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(images)
        return self.decoder(features)


def pixel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-pixel cross-entropy; labels travel as uint8 (an eighth of int64's bytes) and widen on the device."""
    return F.cross_entropy(logits, labels.long())


class RandomSegmentation(Dataset):
    """A pool of random uint8 images with uint8 per-pixel labels, drawn once from a seed; items cycle the pool."""

    def __init__(self, pool: int, image_size: int, classes: int, seed: int, length: int = 4096):
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (pool, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, classes, (pool, image_size, image_size), dtype=torch.uint8, generator=gen)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        slot = index % len(self.images)
        return self.images[slot], self.labels[slot]


OPTIONS = (
    setting("image_size", int, "image side in pixels (a multiple of 16)", ByDevice(256, 64), minimum=16),
    setting("width", int, "encoder width", ByDevice(64, 8), minimum=1),
    setting("classes", int, "per-pixel classes (labels are uint8)", 10, minimum=2),
)


def build(cfg) -> Workload:
    opts = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    image_size, width, classes = opts["image_size"], opts["width"], opts["classes"]
    if not 1 < classes <= 256:
        raise PerflabError(f"segmentation: classes must be 2..256 (labels are uint8), got {classes}")
    if image_size % 16:
        raise PerflabError(f"segmentation: image_size must be a multiple of 16, got {image_size}")
    encoder, decoder = Encoder(width), Decoder(width, classes)
    model = SegmentationModel(encoder, decoder)
    model.train(cfg.mode == "train")
    return Workload(
        name="segmentation",
        model=model,
        dataset=RandomSegmentation(pool=32, image_size=image_size, classes=classes, seed=cfg.seed),
        loss_fn=pixel_cross_entropy,
        optimizer_factory=lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
        description=DESCRIPTION,
        frozen_stage=model.encoder,
        trainable_stage=model.decoder,
        info={"image_size": image_size, "width": width, "classes": classes,
              "frozen": "encoder", "trainable": "decoder"},
    )

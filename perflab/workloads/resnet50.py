"""resnet50: torchvision ResNet-50 image classification, random weights, synthetic images."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset
from torchvision.models import resnet50

from perflab.workloads.base import Workload
from perflab.workloads.settings import resolve_settings, setting

DESCRIPTION = "torchvision ResNet-50 classifier; batches pre-staged on the device by default"
DEFAULT_BATCH = {"cpu": 8, "cuda": 64}


class RandomImages(Dataset):
    """A pool of normalised random images with labels; items repeat modulo the pool."""

    def __init__(self, pool: int, image_res: int, classes: int, seed: int, length: int = 4096):
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randn(pool, 3, image_res, image_res, generator=gen)
        self.labels = torch.randint(0, classes, (pool,), generator=gen)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        slot = index % len(self.labels)
        return self.images[slot], self.labels[slot]


OPTIONS = (
    setting("image_res", int, "image side in pixels", 224, minimum=32),
    setting("classes", int, "output classes", 1000, minimum=2),
)


def build(cfg) -> Workload:
    opts = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    image_res, classes = opts["image_res"], opts["classes"]
    return Workload(
        name="resnet50",
        model=resnet50(weights=None, num_classes=classes),
        dataset=RandomImages(pool=64, image_res=image_res, classes=classes, seed=cfg.seed),
        loss_fn=nn.CrossEntropyLoss(),
        description=DESCRIPTION,
        is_classifier=True,
        default_data="device",
        info={"image_res": image_res, "classes": classes},
    )

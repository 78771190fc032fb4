"""driving: multi-camera end-to-end driving model.

Each sample is 8 camera frames plus a command token (left/straight/right/follow); the target is the
future trajectory as (x, y) waypoints. The dataset decodes JPEG frames, converts, resizes and normalises
them per sample on the CPU, as a real loader does, so the input pipeline is part of what is measured.
With `--augment gpu` (or gpu-stream) the dataset only decodes JPEG to uint8 and `DevicePreprocess` does
the float conversion, resize and normalisation for the whole batch on the device.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from torchvision.io import decode_jpeg, encode_jpeg

from perflab.workloads.base import Workload
from perflab.workloads.settings import ByDevice, resolve_settings, setting

# torchvision 0.29 deprecates its JPEG codec in favour of TorchCodec; it still works and is what we measure.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

DESCRIPTION = "8-camera CNN + command token -> trajectory; JPEG-decoding loader"
DEFAULT_BATCH = {"cpu": 8, "cuda": 32}
CAMERAS = 8
COMMANDS = 4
WAYPOINTS = 8
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class DrivingModel(nn.Module):
    """Shared per-camera CNN backbone, attention fusion across cameras, command embedding, trajectory head."""

    def __init__(self, width: int = 32, feature_dim: int = 256):
        super().__init__()
        self.backbone = nn.Sequential(
            _conv_block(3, width),
            _conv_block(width, width * 2),
            _conv_block(width * 2, width * 4),
            _conv_block(width * 4, feature_dim),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.camera_embedding = nn.Parameter(torch.randn(CAMERAS, feature_dim) * 0.02)
        self.fusion = nn.TransformerEncoderLayer(feature_dim, nhead=4, dim_feedforward=2 * feature_dim,
                                                 batch_first=True)
        self.command_embedding = nn.Embedding(COMMANDS, feature_dim)
        self.head = nn.Sequential(
            nn.Linear(2 * feature_dim, feature_dim),
            nn.ReLU(inplace=True),
            nn.Linear(feature_dim, WAYPOINTS * 2),
        )

    def forward(self, inputs: dict) -> torch.Tensor:
        images, command = inputs["images"], inputs["command"]
        batch, cameras = images.shape[:2]
        per_camera = self.backbone(images.flatten(0, 1)).view(batch, cameras, -1)
        fused = self.fusion(per_camera + self.camera_embedding).mean(dim=1)
        features = torch.cat([fused, self.command_embedding(command)], dim=1)
        return self.head(features).view(batch, WAYPOINTS, 2)


def _synthetic_frame(gen: torch.Generator, size: int) -> torch.Tensor:
    """A uint8 frame with smooth structure plus noise, so JPEG has real work to do."""
    coarse = torch.rand(3, size // 16 + 1, size // 16 + 1, generator=gen)
    smooth = F.interpolate(coarse[None], size=(size, size), mode="bilinear", align_corners=False)[0]
    noisy = smooth + 0.08 * torch.randn(3, size, size, generator=gen)
    return (noisy.clamp(0, 1) * 255).to(torch.uint8)


def preprocess(frames: torch.Tensor, image_res: int, mean: torch.Tensor = MEAN,
               std: torch.Tensor = STD) -> torch.Tensor:
    """uint8 frames (..., 3, H, W) -> float, resized to image_res, normalised; per sample or per batch."""
    images = frames.float().div_(255)
    lead = images.shape[:-3]
    images = images.flatten(0, -4) if lead else images[None]
    if images.shape[-1] != image_res or images.shape[-2] != image_res:
        images = F.interpolate(images, size=(image_res, image_res), mode="bilinear", antialias=True,
                               align_corners=False)
    images = images.view(*lead, *images.shape[-3:]) if lead else images[0]
    return (images - mean) / std


class DevicePreprocess:
    """The dataset's per-sample conversion, resize and normalisation, batched on the device (--augment gpu)."""

    def __init__(self, image_res: int):
        self.image_res = image_res
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch):
        inputs, target = batch
        frames = inputs["images"]
        if frames.device not in self._constants:  # once per device, outside the steady state
            self._constants[frames.device] = (MEAN.to(frames.device), STD.to(frames.device))
        images = preprocess(frames, self.image_res, *self._constants[frames.device])
        return {**inputs, "images": images}, target


class CameraDataset(Dataset):
    """Per sample: decode 8 JPEG frames, uint8 -> float, resize, normalise; plus command and trajectory.

    With `decode_only` the frames stay uint8 at the source resolution (the device preprocesses them).
    """

    def __init__(self, size: int, source_res: int, image_res: int, seed: int, frame_pool: int = 32,
                 decode_only: bool = False):
        gen = torch.Generator().manual_seed(seed)
        self.jpegs = [encode_jpeg(_synthetic_frame(gen, source_res), quality=90) for _ in range(frame_pool)]
        self.size = size
        self.image_res = image_res
        self.decode_only = decode_only
        self.commands = torch.randint(0, COMMANDS, (size,), generator=gen)
        # Trajectories: a smooth curve whose bend depends on the command.
        t = torch.linspace(0.1, 1.0, WAYPOINTS)
        bend = (self.commands.float() - 1.5)[:, None] * 0.5
        noise = 0.05 * torch.randn(size, WAYPOINTS, generator=gen)
        self.trajectories = torch.stack([t.expand(size, -1) * 10, bend * t**2 * 10 + noise], dim=-1)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        pool = len(self.jpegs)
        frames = [decode_jpeg(self.jpegs[(index * CAMERAS + cam * 7) % pool]) for cam in range(CAMERAS)]
        images = torch.stack(frames)
        if not self.decode_only:
            images = preprocess(images, self.image_res)
        return {"images": images, "command": self.commands[index]}, self.trajectories[index]


OPTIONS = (
    setting("image_res", int, "camera image side after resizing, in pixels", ByDevice(224, 64), minimum=16),
    setting("source_res", int, "side of the stored JPEG frames (default: image_res + image_res/7)", minimum=16),
    setting("width", int, "channels of the first backbone block", 32, minimum=1),
)


def build(cfg) -> Workload:
    opts = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    image_res, width = opts["image_res"], opts["width"]
    source_res = opts["source_res"] or image_res + image_res // 7
    on_device = cfg.augment in ("gpu", "gpu-stream")
    return Workload(
        name="driving",
        model=DrivingModel(width=width),
        dataset=CameraDataset(size=1024, source_res=source_res, image_res=image_res, seed=cfg.seed,
                              decode_only=on_device),
        loss_fn=nn.L1Loss(),
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=1e-4),
        description=DESCRIPTION,
        gpu_augment=DevicePreprocess(image_res) if on_device else None,
        supports_augment=True,
        info={"cameras": CAMERAS, "image_res": image_res, "source_res": source_res, "waypoints": WAYPOINTS,
              "preprocess": "device" if on_device else "cpu"},
    )

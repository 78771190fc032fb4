"""augment: image classifier with a heavy augmentation pipeline.

Augmentations: random crop (half the image side), resize back to full size, random rotation (±45°),
Gaussian blur (7x7, random sigma), normalise. Where they run is the `--augment` lever:

- `cpu` (default): the dataset applies the torchvision.transforms.v2 pipeline per sample, on the CPU
  (in DataLoader workers with --workers N);
- `gpu` / `gpu-stream`: the dataset returns raw uint8 images and `BatchAugment` applies the same
  augmentations to the whole batch on the device with per-sample randomness, vectorised: one
  affine_grid + grid_sample does crop, resize and rotation; one depthwise convolution pair does the blur.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torchvision.transforms.v2 as T
from torch import nn
from torch.utils.data import Dataset

from perflab.errors import PerflabError
from perflab.workloads.base import Workload
from perflab.workloads.settings import ByDevice, resolve_settings, setting

DESCRIPTION = "CNN classifier with heavy augmentation: crop, resize, rotate, blur; --augment"
DEFAULT_BATCH = {"cpu": 8, "cuda": 32}
CLASSES = 10
DEGREES = 45.0
BLUR_KERNEL = 7
BLUR_SIGMA = (0.1, 2.0)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def classifier(image_size: int, classes: int, max_width: int) -> nn.Sequential:
    """The seed's model: a 1x1 conv, then stride-2 2x2 convs doubling channels down to 1x1, then a linear."""
    layers: list[nn.Module] = [nn.Conv2d(3, 16, kernel_size=1), nn.ReLU(inplace=True)]
    channels, size = 16, image_size
    while size > 1:
        wider = min(2 * channels, max_width)
        layers += [nn.Conv2d(channels, wider, kernel_size=2, stride=2), nn.ReLU(inplace=True)]
        channels, size = wider, size // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, classes))


def cpu_pipeline(image_size: int) -> T.Compose:
    """The per-sample CPU pipeline (torchvision.transforms.v2) on one uint8 image."""
    return T.Compose([
        T.ToDtype(torch.float32, scale=True),
        T.RandomCrop(image_size // 2),
        T.Resize(image_size, antialias=True),
        T.RandomRotation(degrees=DEGREES, interpolation=T.InterpolationMode.BILINEAR),
        T.GaussianBlur(kernel_size=BLUR_KERNEL, sigma=BLUR_SIGMA),
        T.Normalize(mean=MEAN, std=STD),
    ])


class BatchAugment:
    """The CPU pipeline's augmentations on a whole uint8 batch at once, with per-sample random parameters.

    Random parameters come from this object's own generator (one per device, seeded once), so the same
    seed gives the same augmentations whichever stream runs them and whatever else consumes randomness.
    Crop, resize and rotation are one sampling grid: output pixel -> rotated crop coordinates -> source
    pixel; points that rotate outside the crop read zeros, as RandomRotation's fill does.
    """

    def __init__(self, image_size: int, seed: int, degrees: float = DEGREES, blur_kernel: int = BLUR_KERNEL,
                 blur_sigma: tuple[float, float] = BLUR_SIGMA, mean=MEAN, std=STD):
        self.image_size = image_size
        self.crop_size = image_size // 2
        self.seed = seed
        self.degrees = degrees
        self.blur_kernel = blur_kernel
        self.blur_sigma = blur_sigma
        self.mean, self.std = mean, std
        self._generators: dict[torch.device, torch.Generator] = {}
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: Any) -> Any:
        images, labels = batch
        return self.augment(images), labels

    def generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def augment(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, C, H, W) -> float32 (B, C, S, S): crop, resize, rotate, blur, normalise."""
        if images.dim() != 4:
            raise ValueError(f"BatchAugment expects a (B, C, H, W) batch, got shape {tuple(images.shape)}")
        return self.apply(images, self.draw(images))

    def draw(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample random parameters for a batch, drawn on its device: crop corner, angle, blur sigma."""
        batch, _, height, width = images.shape
        device, gen, crop = images.device, self.generator(images.device), self.crop_size
        if crop > min(height, width):
            raise ValueError(f"crop {crop} is larger than the {height}x{width} images")
        low, high = self.blur_sigma
        return {
            "top": torch.randint(0, height - crop + 1, (batch,), generator=gen, device=device),
            "left": torch.randint(0, width - crop + 1, (batch,), generator=gen, device=device),
            "angle_deg": (torch.rand(batch, generator=gen, device=device) * 2 - 1) * self.degrees,
            "sigma": torch.rand(batch, generator=gen, device=device) * (high - low) + low,
        }

    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """The augmentations with given parameters (deterministic; tests compare devices with it)."""
        pixels = images.float().div_(255)
        pixels = self.crop_resize_rotate(pixels, params["top"], params["left"], params["angle_deg"])
        pixels = self.blur(pixels, params["sigma"])
        mean, std = self._mean_std(pixels.device)
        return pixels.sub_(mean).div_(std)

    def crop_resize_rotate(self, pixels: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                           angle_deg: torch.Tensor) -> torch.Tensor:
        """One grid_sample for the batch: output pixel -> rotated crop coordinate -> source pixel."""
        batch, channels, height, width = pixels.shape
        crop = self.crop_size
        top, left, angle = top.to(pixels.dtype), left.to(pixels.dtype), torch.deg2rad(angle_deg.to(pixels.dtype))
        # Output pixel -> rotated crop coordinate u in [-1, 1] (normalised, align_corners=False).
        cos, sin, zero = torch.cos(angle), torch.sin(angle), torch.zeros_like(angle)
        rotation = torch.stack([torch.stack([cos, -sin, zero], dim=1), torch.stack([sin, cos, zero], dim=1)], dim=1)
        crop_grid = F.affine_grid(rotation, [batch, channels, self.image_size, self.image_size], align_corners=False)
        inside_crop = crop_grid.abs().amax(dim=-1, keepdim=True) <= 1
        edge = 1 - 1 / crop  # clamp to the crop's outer pixel centres: resizing replicates its edge
        crop_grid = crop_grid.clamp(-edge, edge)
        # Crop coordinate -> source coordinate. Python-scalar scales: a tensor built from a list would be a
        # synchronous host-to-device copy.
        source_x = crop_grid[..., 0] * (crop / width) + ((2 * left + crop) / width - 1).view(batch, 1, 1)
        source_y = crop_grid[..., 1] * (crop / height) + ((2 * top + crop) / height - 1).view(batch, 1, 1)
        grid = torch.stack([source_x, source_y], dim=-1)
        grid = torch.where(inside_crop, grid, torch.full_like(grid, 2.0))  # rotated-in corners read zeros
        return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    def blur(self, pixels: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Separable Gaussian blur with a per-sample sigma: two depthwise convolutions over B*C channels."""
        batch, channels, height, width = pixels.shape
        radius = self.blur_kernel // 2
        offsets = torch.arange(self.blur_kernel, device=pixels.device, dtype=pixels.dtype) - radius
        kernel = torch.exp(-0.5 * (offsets / sigma.to(pixels.dtype).view(batch, 1)) ** 2)
        kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(channels, dim=0)
        flat = F.pad(pixels.reshape(1, batch * channels, height, width), [radius] * 4, mode="reflect")
        flat = F.conv2d(flat, kernel.view(-1, 1, self.blur_kernel, 1), groups=batch * channels)
        flat = F.conv2d(flat, kernel.view(-1, 1, 1, self.blur_kernel), groups=batch * channels)
        return flat.view(batch, channels, height, width)

    def _mean_std(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._constants:
            self._constants[device] = (torch.tensor(self.mean, device=device).view(1, -1, 1, 1),
                                       torch.tensor(self.std, device=device).view(1, -1, 1, 1))
        return self._constants[device]


class RandomImages(Dataset):
    """A pool of random uint8 images with labels; `transform` (the CPU pipeline) applies per item if given."""

    def __init__(self, pool: int, image_size: int, classes: int, seed: int, transform=None,
                 length: int = 100_000):
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (pool, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, classes, (pool,), generator=gen)
        self.transform = transform
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        slot = index % len(self.labels)
        image = self.images[slot]
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[slot]


OPTIONS = (
    setting("image_size", int, "image side in pixels (a power of two)", ByDevice(256, 64), minimum=4),
    setting("max_width", int, "widest convolution's channels", ByDevice(4096, 256), minimum=16),
)


def build(cfg) -> Workload:
    opts = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    image_size, max_width = opts["image_size"], opts["max_width"]
    if image_size < 4 or image_size & (image_size - 1):
        raise PerflabError(f"augment: image_size must be a power of two >= 4, got {image_size}")
    on_device = cfg.augment in ("gpu", "gpu-stream")
    dataset = RandomImages(pool=64, image_size=image_size, classes=CLASSES, seed=cfg.seed,
                           transform=None if on_device else cpu_pipeline(image_size))
    return Workload(
        name="augment",
        model=classifier(image_size, CLASSES, max_width),
        dataset=dataset,
        loss_fn=nn.CrossEntropyLoss(),
        description=DESCRIPTION,
        gpu_augment=BatchAugment(image_size, seed=cfg.seed) if on_device else None,
        supports_augment=True,
        is_classifier=True,
        info={"image_size": image_size, "max_width": max_width, "augment": cfg.augment or "cpu",
              "augmentations": "random crop 1/2, resize, rotation ±45°, gaussian blur 7x7, normalise"},
    )

"""A plain ResNet-50 training script, the kind perflab profiles unchanged (`perflab profile -- python resnet50_train.py`).

    python benchmarks/scripts/resnet50_train.py --batch 128 --precision bf16 --steps 60 [--data loader --workers 4]

It prints its own throughput (steps after --warmup, device synchronised at both ends) as one JSON line, so a
benchmark can set the script alone beside the same script under perflab. Its settings mirror perflab's built-in
`resnet50` workload: random weights, SGD with momentum, cross-entropy, strict fp32 outside autocast, and with
`--data device` four distinct batches pre-staged on the GPU.
"""
import argparse
import json
import time

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """Random normalised images from a small pool, so the loader does real copying but no decoding."""

    def __init__(self, pool: int = 64, length: int = 100_000, image_res: int = 224):
        gen = torch.Generator().manual_seed(0)
        self.images = torch.randn(pool, 3, image_res, image_res, generator=gen)
        self.labels = torch.randint(0, 1000, (pool,), generator=gen)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return self.images[index % len(self.labels)], self.labels[index % len(self.labels)]


def batches(args, device):
    """Endless (images, labels): pre-staged on the device, or from a DataLoader copied each step."""
    if args.data == "device":
        staged = [(torch.randn(args.batch, 3, args.image_res, args.image_res, device=device),
                   torch.randint(0, 1000, (args.batch,), device=device)) for _ in range(4)]
        while True:
            yield from staged
    loader = DataLoader(RandomImages(image_res=args.image_res), batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        pin_memory=True, drop_last=True, persistent_workers=args.workers > 0)
    while True:
        for images, labels in loader:
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--device", default="cuda", help="cpu for a quick smoke test")
    parser.add_argument("--data", choices=["device", "loader"], default="device")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--image-res", type=int, default=224)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32, as in perflab's runs
    torch.set_float32_matmul_precision("highest")
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    data = batches(args, device)

    for step in range(args.steps):
        if step == args.warmup:
            synchronize(device)
            began = time.perf_counter()
        images, labels = next(data)
        with autocast:
            loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    elapsed = time.perf_counter() - began
    timed = args.steps - args.warmup
    print(json.dumps({"script": "resnet50_train", "steps_per_s": timed / elapsed,
                      "samples_per_s": timed * args.batch / elapsed, "final_loss": loss.item()}))


if __name__ == "__main__":
    main()

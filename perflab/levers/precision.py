"""Precision levers: tf32 matmuls/convolutions, bf16 autocast, fp16 autocast with a gradient scaler."""
from __future__ import annotations

from typing import Optional

import torch

from perflab.backends import set_tf32
from perflab.levers import Lever

NUMERIC = ("compute bound", "memory bandwidth", "activation memory")


def _refuse_bf16(cfg, workload, device) -> Optional[str]:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name(device)} has no bf16 support; use --precision fp16"
    return None


def _apply_tf32(plan, cfg) -> None:
    plan.cleanups.append(set_tf32(True))


def _apply_bf16(plan, cfg) -> None:
    plan.autocast_dtype = torch.bfloat16


def _apply_fp16(plan, cfg) -> None:
    plan.autocast_dtype = torch.float16
    if plan.mode == "train":
        plan.scaler = torch.amp.GradScaler("cuda")


LEVERS = [
    Lever("tf32", "precision", "tf32", "TF32 tensor cores for fp32 matmuls and convolutions",
          "CUDA (Ampere or newer)", NUMERIC, 20, _apply_tf32),
    Lever("bf16", "precision", "bf16", "bf16 autocast for forward and loss",
          "a device with bf16 (CPU or Ampere+ GPU)", NUMERIC, 20, _apply_bf16, _refuse_bf16),
    Lever("fp16", "precision", "fp16", "fp16 autocast; training adds a dynamic gradient scaler",
          "CUDA", NUMERIC, 20, _apply_fp16),
]

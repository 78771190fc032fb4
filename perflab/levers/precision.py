"""Precision levers: tf32 matmuls/convolutions, bf16 autocast, fp16 autocast with a gradient scaler."""
from __future__ import annotations

from typing import Optional

import torch

from perflab.backends import set_tf32
from perflab.bottlenecks import (ACTIVATION_MEMORY, COMPUTE_BOUND, DECODE_COMPUTE_BOUND, FP32_MATMULS, FULL_PRECISION,
                                 MEMORY_BANDWIDTH)
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints

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


# Reduced precision is named by the compute, memory-bandwidth and activation-memory rules while the run is at
# full precision; a reduced float format pairs with channels-last (cuDNN's tensor-core convolutions want NHWC
# in bf16/fp16; in NCHW a bf16 network spends its time in layout transposes). On a bandwidth-bound step a 16-bit
# format halves the bytes moved: at most half of that time goes (HALF_THE_BYTES), not all of it (a chain of 219
# elementwise ops holding 94% of the step had bf16 "predicted +1686%" beside compile's).
HALF_THE_BYTES = 0.5
LEVERS = [
    Lever("tf32", "precision", "tf32", "TF32 tensor cores for fp32 matmuls and convolutions",
          "CUDA (Ampere or newer)",
          (Address(COMPUTE_BOUND, 2, FULL_PRECISION), Address(MEMORY_BANDWIDTH), Address(ACTIVATION_MEMORY),
           Address(COMPUTE_BOUND, 1, FP32_MATMULS)), 20,
          _apply_tf32,
          in_code="torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True",
          when_lost="TF32 lost: the fp32 matmuls are not the limit; a larger batch or less work is",
          tune=TuneHints(ONE_TRIAL, tier=1)),
    Lever("bf16", "precision", "bf16", "bf16 autocast for forward and loss",
          "a device with bf16 (CPU or Ampere+ GPU)",
          (Address(COMPUTE_BOUND, 1, FULL_PRECISION), Address(MEMORY_BANDWIDTH, 4, FULL_PRECISION, HALF_THE_BYTES),
           Address(ACTIVATION_MEMORY, 2, FULL_PRECISION), Address(COMPUTE_BOUND, 1, DECODE_COMPUTE_BOUND),
           Address(COMPUTE_BOUND, 2, FP32_MATMULS)), 20,
          _apply_bf16,
          in_code="with torch.autocast('cuda', dtype=torch.bfloat16): around the forward and the loss",
          when_lost="bf16 lost: the matmuls are not the limit at this size; a larger batch or less work is",
          tune=TuneHints(ONE_TRIAL, partner="channels-last", tier=2, screen_always=2), checks=_refuse_bf16),
    Lever("fp16", "precision", "fp16", "fp16 autocast; training adds a dynamic gradient scaler",
          "CUDA",
          (Address(COMPUTE_BOUND, 3, FULL_PRECISION), Address(MEMORY_BANDWIDTH, 5, FULL_PRECISION, HALF_THE_BYTES),
           Address(ACTIVATION_MEMORY, 3, FULL_PRECISION)), 20, _apply_fp16,
          in_code="torch.autocast('cuda', dtype=torch.float16) with a torch.amp.GradScaler",
          when_lost="fp16 lost: the matmuls are not the limit at this size; a larger batch or less work is",
          tune=TuneHints(ONE_TRIAL, partner="channels-last", tier=2)),
]

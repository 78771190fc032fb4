"""--compile MODE: torch.compile the model; compilation happens in warm-up and is reported apart."""
from __future__ import annotations

from typing import Optional

import torch

from perflab.levers import Lever


def _refuse(cfg, workload, device) -> Optional[str]:
    if cfg.warmup < 2:
        return "compilation must stay out of the numbers: use --warmup 2 or more"
    return None


def _apply(plan, cfg) -> None:
    plan.model = torch.compile(plan.model, mode=cfg.compile)
    plan.notes.append("the first warm-up step includes compilation: see compile_s")


LEVERS = [
    Lever("compile", "compile", None, "torch.compile: fused kernels (Inductor); reduce-overhead adds CUDA graphs",
          "torch 2.x and a C++ compiler (CPU) or Triton (CUDA)",
          ("launch / framework overhead", "memory bandwidth"), 60, _apply, _refuse),
]

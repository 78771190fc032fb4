"""--compile MODE: torch.compile the model; compilation happens in warm-up and is reported apart."""
from __future__ import annotations

from typing import Optional

import torch

from perflab.bottlenecks import (COMPUTE_BOUND, DECODE_LAUNCH_BOUND, INFERENCE_QUEUE, LAUNCH_OVERHEAD,
                                 MEMORY_BANDWIDTH, UNFUSED_CHAINS)
from perflab.levers import COMPILES, Address, Lever, TuneHints, ValueHints
from perflab.levers.generation import own_loop_refusal


def _refuse(cfg, workload, device) -> Optional[str]:
    if cfg.warmup < 2:
        return "compilation must stay out of the numbers: use --warmup 2 or more"
    own_loop = own_loop_refusal(cfg, workload, device)
    if own_loop is not None:
        return own_loop
    if workload.generation is not None and cfg.kv_cache != "static":
        return "compiling the decode step needs fixed shapes: add --kv-cache static"
    return None


def _apply(plan, cfg) -> None:
    if plan.generation is not None:  # generation compiles its decode step (prefill lengths vary: it stays eager)
        plan.generation.compile_mode = cfg.compile
        plan.notes.append("the first warm-up step includes compiling the decode step: see compile_s")
        return
    plan.model = torch.compile(plan.model, mode=cfg.compile)
    plan.notes.append("the first warm-up step includes compilation: see compile_s")


# What tune knows of each mode, default first: its trial measures what compiling adds; the others' cost is scaled
# from it (cost_scale; no constant before anything has compiled: the first compile trial is the measurement, and its
# time limit is the budget left). max-autotune's 15x: on the H100, ResNet-50 infer at batch 256 spent 24-26 s
# compiling in default mode and had not finished max-autotune after 224 s, nor, in another run, after 263 s (over
# 11x). Warm-up: the first step compiles; with CUDA graphs (reduce-overhead, max-autotune) Inductor warms up on the
# second call and records on the third. On CUDA, CUDA graphs (reduce-overhead) come first where launching is the
# finding, else max-autotune (better kernels for a compute- or memory-bound step; it captures CUDA graphs too).
MODES = {
    "default": ValueHints(cost_scale=1.0, warmup=2),
    "max-autotune": ValueHints(cost_scale=15.0, warmup=3, cuda_only=True),
    "reduce-overhead": ValueHints(cost_scale=1.5, warmup=3, cuda_only=True, leads_for=(LAUNCH_OVERHEAD,),
                                  covered_by=(("max-autotune", "already captures CUDA graphs"),)),
}

LEVERS = [
    Lever("compile", "compile", None, "torch.compile: fused kernels (Inductor); reduce-overhead adds CUDA graphs",
          "torch 2.x and a C++ compiler (CPU) or Triton (CUDA)",
          (Address(LAUNCH_OVERHEAD, 2), Address(MEMORY_BANDWIDTH, 1), Address(COMPUTE_BOUND, 7),
           Address(INFERENCE_QUEUE, 1), Address(LAUNCH_OVERHEAD, 2, DECODE_LAUNCH_BOUND),
           Address(MEMORY_BANDWIDTH, 1, UNFUSED_CHAINS), Address(LAUNCH_OVERHEAD, 1, UNFUSED_CHAINS)), 60, _apply,
          in_code="model = torch.compile(model)",
          when_lost="torch.compile lost: fuse by hand (fewer, larger tensor ops), or a larger batch",
          tune=TuneHints(COMPILES, screen_always=4, values=tuple(MODES), per_value=MODES), checks=_refuse),
]

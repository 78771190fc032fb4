"""build_plan: the workload on its device as a StepPlan, with every active lever's edit applied (refusals raise first)."""
from __future__ import annotations

import torch
from torch import nn

from perflab.backends import set_tf32
from perflab.errors import PerflabError
from perflab.generation.plan import attach_settings, prepare_generation
from perflab.step.plan import StepPlan
from perflab.levers import apply_levers, check_levers
from perflab.workloads.base import Workload


def build_plan(workload: Workload, cfg, device: torch.device, levers=None) -> StepPlan:
    """Move the workload to the device and let every active lever edit the step. Refusals raise first."""
    levers = check_levers(cfg, workload, device) if levers is None else levers
    train = cfg.mode == "train"
    model = workload.model.to(device)
    model.train(train)
    loss_fn = workload.loss_fn
    if isinstance(loss_fn, nn.Module):
        loss_fn = loss_fn.to(device)
    plan = StepPlan(
        workload=workload,
        device=device,
        mode=cfg.mode,
        batch_size=cfg.batch_size,
        data_source=workload.default_data if cfg.data == "auto" else cfg.data,
        model=model,
        eager_model=model,
        loss_fn=loss_fn,
        optimizer=workload.make_optimizer() if train else None,
        non_blocking=cfg.non_blocking,
        pin_memory=cfg.pins_memory(device.type),
    )
    if workload.generation is not None:
        attach_settings(plan)
    elif cfg.slo:
        raise PerflabError(f"--slo applies to generation workloads (TTFT/TPOT per request); {workload.name} does "
                           "not generate tokens: try --workload generate")
    if device.type == "cuda":
        # "fp32" means fp32: PyTorch lets cuDNN use TF32 by default, which would flatter the baseline.
        plan.cleanups.append(set_tf32(False))
    apply_levers(plan, cfg, levers)
    if plan.generation is not None:
        prepare_generation(plan, cfg)
    return plan

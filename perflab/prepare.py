"""Before a measurement: the config resolved, the workload loaded and seeded, its levers checked and applied.

    cfg = resolve_config(config, workload)          # validated; device and batch made concrete
    workload = load(workload, cfg)                   # seeded, built (a built-in, a plugin, or the caller's)
    with prepared(workload, cfg, device) as prep:    # levers checked and applied to a StepPlan, cleaned up after

The pipeline (perflab/pipeline.py) conducts a run from here; memory/ profiles one step from the same preparation,
and the pipeline asks memory/ for an out-of-memory's advice, so this lives below both.
"""
from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.step.plan import StepPlan
from perflab.levers import Lever, check_levers
from perflab.levers.plan import build_plan
from perflab.ranks import needs_launch
from perflab.workloads import Workload, default_batch
from perflab.workloads.reuse import load_or_build


def resolve_device(requested: str) -> torch.device:
    """The torch device of --device auto|cuda|cpu (auto: CUDA when torch sees a GPU)."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise PerflabError("--device cuda: no CUDA GPU is visible to torch here; use --device cpu or auto")
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def resolve_config(config: RunConfig, workload: Union[Workload, str, None]) -> RunConfig:
    """Validated config with the device and batch size made concrete, as recorded in result.json."""
    cfg = config.validate()
    if needs_launch(cfg):
        from perflab.distributed.launch import check_visible_gpus  # the launcher's module starts torchrun
        check_visible_gpus(cfg.nproc, cfg.device)
    device = resolve_device(cfg.device)
    spec = workload.name if isinstance(workload, Workload) else (workload or cfg.workload)
    return cfg.replace(workload=spec, device=device.type,
                       batch_size=cfg.batch_size or default_batch(spec, device.type))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load(workload: Union[Workload, str, None], cfg: RunConfig) -> Workload:
    """The workload of a run, seeded first: the caller's Workload as it is, or the one cfg.workload names."""
    seed_everything(cfg.seed)
    if isinstance(workload, Workload):
        return workload
    return load_or_build(cfg)  # tune's warm worker reuses the workload it built (perflab/workloads/reuse.py)


@dataclass
class Prepared:
    """A workload with its levers applied: what a measurement stage runs, and what the quality gate starts from."""

    cfg: RunConfig
    device: torch.device
    workload: Workload
    levers: list[Lever]
    plan: StepPlan
    pristine: Optional[Workload]  # the weights before anything trained them, when the quality gate will run


def quality_gate_enabled(cfg: RunConfig, levers: Sequence[Lever]) -> bool:
    """--check-quality when given; otherwise on exactly when an active lever changes numerics."""
    if cfg.check_quality is not None:
        return cfg.check_quality
    return any(lever.changes_numerics for lever in levers)


@contextmanager
def prepared(workload: Workload, cfg: RunConfig, device: torch.device) -> Iterator[Prepared]:
    """Check the levers (refusals raise before anything moves), keep a pristine copy for the gate, build the
    StepPlan; the plan's clean-ups (hooks, side streams, captured graphs) run on the way out."""
    levers = check_levers(cfg, workload, device)
    # The gate runs after the timed run (so compilation is timed where a user pays for it, in warm-up), from a
    # copy of the weights taken before anything trained them. The dataset is shared, not copied.
    pristine = (copy.deepcopy(workload, memo={id(workload.dataset): workload.dataset})
                if quality_gate_enabled(cfg, levers) else None)
    plan = build_plan(workload, cfg, device, levers)
    try:
        yield Prepared(cfg, device, workload, levers, plan, pristine)
    finally:
        plan.cleanup()

"""Levers: named, composable optimisations. Each module defines LEVERS, a list of Lever objects.

A lever says when it is on (from the RunConfig), what it needs (a refusal reason or None), which
bottleneck classes it addresses, and how it edits the StepPlan. `apply_levers` checks every active lever
before any of them runs, so a refused lever stops the run before anything is measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from perflab.errors import PerflabError

Refusal = Callable[..., Optional[str]]


@dataclass(frozen=True)
class Lever:
    name: str  # the name diagnosis uses to propose it, e.g. "channels-last"
    flag: str  # how to switch it on from the CLI
    summary: str
    needs: str  # human text: what it requires
    addresses: tuple[str, ...]  # bottleneck classes, as the diagnosis names them (docs/diagnose.md)
    order: int  # application order: data path < precision < layout < optimizer < compile < graphs
    is_active: Callable  # (cfg) -> bool
    refusal: Refusal  # (cfg, workload, device) -> reason or None
    apply: Callable  # (plan, cfg) -> None
    changes_numerics: bool = False  # True: outputs may differ from fp32 eager, so the quality gate runs


def all_levers() -> list[Lever]:
    """Every lever perflab knows, in application order."""
    from perflab.levers import (compile, cuda_graphs, data_path, memory_format, optimizer, precision,
                                prefetcher)
    modules = [data_path, prefetcher, precision, memory_format, optimizer, compile, cuda_graphs]
    modules += _optional_modules()
    levers = [lever for module in modules for lever in module.LEVERS]
    return sorted(levers, key=lambda lever: lever.order)


def _optional_modules() -> list:
    """Lever modules that ship with the workloads that need them (augment, pipeline, checkpointing, sdpa)."""
    import importlib
    found = []
    for name in ("augment", "pipeline", "checkpointing", "sdpa"):
        try:
            found.append(importlib.import_module(f"perflab.levers.{name}"))
        except ModuleNotFoundError as err:
            if err.name != f"perflab.levers.{name}":
                raise
    return found


def lever_names() -> list[str]:
    return [lever.name for lever in all_levers()]


def active_levers(cfg) -> list[Lever]:
    return [lever for lever in all_levers() if lever.is_active(cfg)]


def check_levers(cfg, workload, device: torch.device) -> list[Lever]:
    """The active levers, or PerflabError with the first refusal's reason."""
    levers = active_levers(cfg)
    for lever in levers:
        reason = lever.refusal(cfg, workload, device)
        if reason:
            raise PerflabError(f"{lever.flag} refused: {reason}")
    return levers


def apply_levers(plan, cfg, levers: list[Lever]) -> None:
    for lever in levers:
        lever.apply(plan, cfg)
        plan.levers.append(lever.name)


def never(*_args) -> Optional[str]:
    return None


def needs_cuda(what: str) -> Refusal:
    def refusal(cfg, workload, device) -> Optional[str]:
        if device.type != "cuda":
            return f"{what} needs a CUDA GPU and this run is on {device.type}; drop the flag or use --device cuda"
        return None
    return refusal


def needs_train(what: str) -> Refusal:
    def refusal(cfg, workload, device) -> Optional[str]:
        if cfg.mode != "train":
            return f"{what} only applies to --mode train"
        return None
    return refusal


def first_refusal(*refusals: Refusal) -> Refusal:
    def refusal(cfg, workload, device) -> Optional[str]:
        for check in refusals:
            reason = check(cfg, workload, device)
            if reason:
                return reason
        return None
    return refusal

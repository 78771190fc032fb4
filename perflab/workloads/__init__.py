"""Built-in workloads by name, and loading of user workloads (`file.py:build` or `package.module:build`)."""
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

from perflab.errors import PerflabError
from perflab.workloads.base import Workload
from perflab.workloads.contract import DatasetShorterThanBatch, check_contract
from perflab.workloads.plugin import build_user_workload, is_plugin_spec, load_user_build
from perflab.workloads.settings import check_settings

# One line here per built-in workload; each module has DESCRIPTION, DEFAULT_BATCH and build(cfg).
BUILTIN_MODULES = {
    "driving": "perflab.workloads.driving",
    "resnet50": "perflab.workloads.resnet50",
    "mlp": "perflab.workloads.mlp",
    "segmentation": "perflab.workloads.segmentation",
    "augment": "perflab.workloads.augment",
    "transformer": "perflab.workloads.transformer",
    "generate": "perflab.workloads.generate",
}

FALLBACK_BATCH = 32


def builtin_module(name: str) -> ModuleType:
    return importlib.import_module(BUILTIN_MODULES[name])


def builtin_descriptions() -> dict[str, str]:
    """Name -> one-line description of every built-in workload."""
    return {name: builtin_module(name).DESCRIPTION for name in BUILTIN_MODULES}


def default_batch(spec: str, device: str) -> int:
    """The batch size a workload runs at when none is given."""
    if spec in BUILTIN_MODULES:
        return builtin_module(spec).DEFAULT_BATCH[device]
    return FALLBACK_BATCH


def check_spec(spec: str) -> None:
    """Refuse a workload name that is neither built in nor a plugin spec (before any work starts)."""
    if spec in BUILTIN_MODULES or is_plugin_spec(spec):
        return
    names = ", ".join(BUILTIN_MODULES)
    raise PerflabError(f"unknown workload {spec!r}: use one of {names}, "
                       "or your own as path/to/file.py:build or package.module:build")


def load_workload(spec: str, cfg) -> Workload:
    """Build the workload named by `spec` for a config whose device and batch size are resolved."""
    if spec in BUILTIN_MODULES:
        build = builtin_module(spec).build
    else:
        check_spec(spec)
        build = load_user_build(spec)
    declared = declared_settings(build)
    if declared is not None:
        cfg = cfg.replace(workload_options=check_settings(spec, declared, cfg.workload_options))
    if spec in BUILTIN_MODULES:
        workload = build(cfg)  # perflab's own: its exceptions are bugs, and raise
    else:
        workload = build_user_workload(spec, build, cfg)
    check_contract(spec, workload, cfg)
    return workload


def declared_settings(build) -> Optional[Sequence]:
    """The `--option` keys the module defining `build` declares (its OPTIONS), or None if it declares none."""
    module = sys.modules.get(getattr(build, "__module__", ""), None)
    return getattr(module, "OPTIONS", None)


def builtin_settings() -> dict[str, Sequence]:
    """Name -> the declared `--option` settings of every built-in workload."""
    return {name: getattr(builtin_module(name), "OPTIONS", ()) for name in BUILTIN_MODULES}


__all__ = ["Workload", "load_workload", "DatasetShorterThanBatch", "builtin_descriptions", "default_batch",
           "BUILTIN_MODULES"]

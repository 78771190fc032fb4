"""Built-in workloads by name, and loading of user workloads (`file.py:build` or `package.module:build`)."""
from __future__ import annotations

import importlib
from types import ModuleType

from perflab.errors import PerflabError
from perflab.workloads.base import Workload
from perflab.workloads.plugin import build_user_workload, load_user_build

# One line here per built-in workload; each module has DESCRIPTION, DEFAULT_BATCH and build(cfg).
BUILTIN_MODULES = {
    "driving": "perflab.workloads.driving",
    "resnet50": "perflab.workloads.resnet50",
    "mlp": "perflab.workloads.mlp",
    "segmentation": "perflab.workloads.segmentation",
    "augment": "perflab.workloads.augment",
    "transformer": "perflab.workloads.transformer",
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


def is_user_spec(spec: str) -> bool:
    return ":" in spec or spec.endswith(".py")


def load_workload(spec: str, cfg) -> Workload:
    """Build the workload named by `spec` for a config whose device and batch size are resolved."""
    if spec in BUILTIN_MODULES:
        workload = builtin_module(spec).build(cfg)  # perflab's own: its exceptions are bugs, and raise
    elif is_user_spec(spec):
        workload = build_user_workload(spec, load_user_build(spec), cfg)
    else:
        names = ", ".join(BUILTIN_MODULES)
        raise PerflabError(f"unknown workload {spec!r}: use one of {names}, "
                           "or your own as path/to/file.py:build or package.module:build")
    _check_contract(spec, workload, cfg.mode)
    return workload


def _check_contract(spec: str, workload: Workload, mode: str) -> None:
    if not hasattr(workload.model, "parameters"):
        raise PerflabError(f"{spec}: Workload.model must be a torch.nn.Module")
    try:
        length = len(workload.dataset)
    except TypeError:
        raise PerflabError(f"{spec}: Workload.dataset must be a map-style torch Dataset with __len__") from None
    if length == 0:
        raise PerflabError(f"{spec}: Workload.dataset is empty; give it at least one (input, target) item")
    if mode == "train" and workload.loss_fn is None:
        raise PerflabError(f"{spec}: --mode train needs Workload.loss_fn; set it or run with --mode infer")


__all__ = ["Workload", "load_workload", "builtin_descriptions", "default_batch", "BUILTIN_MODULES"]

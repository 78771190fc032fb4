"""Find a user's `build` function from `path/to/file.py:build` or `package.module:build`."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from perflab.errors import PerflabError


def _split(spec: str) -> tuple[str, str]:
    """(file or module, build function name) of a plugin spec."""
    target, _, attr = spec.rpartition(":")
    if not target:  # "file.py" alone
        target, attr = spec, "build"
    return target, attr or "build"


def is_plugin_spec(spec: str) -> bool:
    """True for a user's workload (`file.py[:build]` or `package.module:build`), not a built-in name."""
    return ":" in spec or spec.endswith(".py")


def plugin_name(spec: str) -> str:
    """What a plugin spec is called: its file's stem (`models/bert.py:build` -> bert) or its module's name."""
    target, _ = _split(spec)
    return Path(target).stem if target.endswith(".py") else target


def load_user_build(spec: str) -> Callable:
    """Import the module named in `spec` and return its build callable."""
    target, attr = _split(spec)
    module = _import_file(target) if target.endswith(".py") else _import_module(target)
    build = getattr(module, attr, None)
    if build is None:
        raise PerflabError(f"{target} has no {attr!r}; define `def {attr}(cfg) -> perflab.Workload` there")
    if not callable(build):
        raise PerflabError(f"{target}:{attr} is not callable; it must be a function build(cfg) -> Workload")
    return build


def _import_file(path_text: str):
    path = Path(path_text)
    if not path.is_file():
        raise PerflabError(f"workload file {path_text} does not exist; check the path (relative to {Path.cwd()})")
    name = f"perflab_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling (DataLoader workers) look modules up here
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise PerflabError(f"workload file {path_text} has a syntax error at line {err.lineno}: {err.msg}") from None
    finally:
        sys.path.pop(0)
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise PerflabError(f"cannot import workload module {name!r}: no module named {err.name!r}; "
                               "is it installed or on PYTHONPATH?") from None
        raise

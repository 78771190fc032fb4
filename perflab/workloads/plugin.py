"""Find a user's `build` function from `path/to/file.py:build` or `package.module:build`, and call it.

Failures in the user's module (a syntax error, an import inside it that fails, an exception while it runs)
become PerflabErrors that point at the user's file and line, not a traceback through importlib.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from perflab.errors import PerflabError, UserCodeError, is_users_fault
from perflab.workloads.base import Workload


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


def call_user_build(spec: str, build: Callable, cfg) -> object:
    """build(cfg) of the user's `spec`; its exceptions (a sys.exit too: it would end perflab with nothing run) become
    a UserCodeError naming the plugin and showing the user's own frames."""
    try:
        return build(cfg)
    except (Exception, SystemExit) as err:
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"running your {spec} ({_split(spec)[1]}(cfg))", err) from err


def build_user_workload(spec: str, build: Callable, cfg) -> Workload:
    """Call the user's build(cfg); its exceptions and a wrong return type become errors that point at it."""
    workload = call_user_build(spec, build, cfg)
    if not isinstance(workload, Workload):
        raise PerflabError(f"{spec}: build(cfg) {_where(build)}returned {type(workload).__name__}, expected a "
                           "perflab.Workload(model=..., dataset=..., loss_fn=...)")
    if not workload.name:
        workload = dataclasses.replace(workload, name=plugin_name(spec))
    return workload


def _where(function: Callable) -> str:
    try:
        return f"at {inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]} "
    except (TypeError, OSError):
        return ""


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
        sys.modules.pop(name, None)
        raise PerflabError(_syntax_message(f"workload file {path_text}", err)) from None
    except (Exception, SystemExit) as err:
        sys.modules.pop(name, None)
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"importing your workload file {path_text}", err) from err
    finally:
        sys.path.pop(0)
    return module


def _syntax_message(what: str, err: SyntaxError) -> str:
    """'... has a syntax error at file:line: msg' and the offending line with a caret under the column."""
    message = f"{what} has a syntax error at {err.filename}:{err.lineno}: {err.msg}"
    if err.text:
        line = err.text.rstrip("\n")
        stripped = line.lstrip()
        message += f"\n    {stripped}"
        if err.offset:
            column = max(0, err.offset - 1 - (len(line) - len(stripped)))
            message += "\n    " + " " * column + "^"
    return message


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise PerflabError(f"cannot import workload module {name!r}: no module named {err.name!r}; "
                               "is it installed or on PYTHONPATH?") from None
        raise UserCodeError(f"importing your workload module {name}", err) from err
    except SyntaxError as err:
        raise PerflabError(_syntax_message(f"workload module {name}", err)) from None
    except Exception as err:
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"importing your workload module {name}", err) from err

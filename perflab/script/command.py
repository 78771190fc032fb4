"""The user's command after `--`: which script or module to run, with which arguments, and running it as Python would.

    python train.py ARGS      train.py ARGS      python -m package.module ARGS      -m package.module ARGS
"""
from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from perflab.errors import PerflabError

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PERFLAB_DIR = os.path.realpath(Path(__file__).parent.parent) + os.sep


@dataclass
class ScriptCommand:
    """A script path or a module name, and the arguments the script receives in sys.argv[1:]."""

    target: str
    args: list[str] = field(default_factory=list)
    is_module: bool = False

    @property
    def name(self) -> str:
        """A short label: the script's file name or the module's name."""
        return self.target if self.is_module else Path(self.target).name

    def shown(self) -> list[str]:
        """The command as the user would type it."""
        return ["python"] + (["-m"] if self.is_module else []) + [self.target, *self.args]

    def to_dict(self) -> dict:
        return {"target": self.target, "path": self.path(), "args": list(self.args), "module": self.is_module}

    def path(self) -> str:
        """Absolute path of the script (or of the module's file)."""
        if not self.is_module:
            return str(Path(self.target).resolve())
        spec = importlib.util.find_spec(self.target)
        return str(spec.origin) if spec is not None and spec.origin else self.target


def _is_python(word: str) -> bool:
    return _PYTHON.match(Path(word).name) is not None or os.path.realpath(word) == os.path.realpath(sys.executable)


def parse_command(words: Sequence[str]) -> ScriptCommand:
    """Read `python train.py ARGS`, `-m module ARGS` and the like; raise PerflabError for anything else."""
    words = list(words)
    if words and _is_python(words[0]):
        words = words[1:]
    if not words:
        raise PerflabError("nothing to run after `--`: give a script, e.g. `-- python train.py --epochs 1`")
    if words[0] == "-m":
        if len(words) < 2:
            raise PerflabError("`-m` needs a module name, e.g. `-- python -m mypackage.train`")
        return ScriptCommand(words[1], words[2:], is_module=True)
    if words[0].startswith("-"):
        raise PerflabError(f"python option {words[0]} is not supported after `--`: give `python train.py ARGS` "
                           "or `python -m package.module ARGS`")
    return ScriptCommand(words[0], words[1:])


def check_command(command: ScriptCommand) -> ScriptCommand:
    """Raise PerflabError unless the script file or the module can be found (before anything runs)."""
    if command.is_module:
        try:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
            found = importlib.util.find_spec(command.target) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise PerflabError(f"no module named {command.target!r} (from {os.getcwd()}): check the name, or "
                               "install the package, or run from the directory that holds it")
        return command
    path = Path(command.target)
    if not path.is_file():
        where = "is a directory" if path.is_dir() else "does not exist"
        raise PerflabError(f"script {command.target} {where}: give the path of a Python file, e.g. "
                           "`-- python train.py`")
    return command


def execute(command: ScriptCommand) -> None:
    """Run the script as `python` would: its own sys.argv, `__name__ == "__main__"`, its folder first on sys.path.

    Returns when the script does; its exceptions (SystemExit and KeyboardInterrupt included) propagate.
    """
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if command.is_module:
            sys.argv = [command.target, *command.args]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [command.target, *command.args]
            sys.path.insert(0, str(Path(command.target).resolve().parent))
            runpy.run_path(command.target, run_name="__main__")
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def script_traceback(error: BaseException) -> str:
    """The exception's traceback as Python would print it, without the frames of perflab and runpy above the script."""
    tb = error.__traceback__
    while tb is not None and _is_ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _is_ours(filename: str) -> bool:
    if filename == "<frozen runpy>":  # Python 3.11+ runs runpy from its frozen modules
        return True
    path = os.path.realpath(filename)
    return path == os.path.realpath(runpy.__file__) or path.startswith(_PERFLAB_DIR)

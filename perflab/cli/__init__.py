"""The perflab command line: parses, calls the library, prints. Each subcommand is a module here.

A module in this package that defines `register(subparsers)` is picked up automatically; `register`
adds its parser(s) with `set_defaults(handler=...)`, and the handler returns an exit code.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
from typing import NoReturn, Optional

from rich.console import Console
from rich.markup import escape

from perflab.errors import (OutOfMemoryFailure, PerflabError, WorkloadExited, exit_message, interrupt_name,
                            os_error_line)
from perflab.oom import kept_traceback
from perflab.version import __version__

console = Console()
err_console = Console(stderr=True)

# Commands appear in --help in this order; modules not listed come after, alphabetically.
ORDER = ["run", "profile", "memory", "diagnose", "sweep", "scale", "compare", "report", "serve", "rerun", "tune", "info"]


def _command_modules() -> list:
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    modules = [importlib.import_module(f"{__name__}.{name}") for name in names]
    return [module for module in modules if hasattr(module, "register")]


NEGATIVE_VALUE = re.compile(r"^-\.?\d")  # -1, -5m, -.5: a negative value, never one of perflab's flags


class OneLineErrorParser(argparse.ArgumentParser):
    """A command line perflab cannot read is one line on stderr (what was wrong, where --help is) and exit 2,
    not argparse's usage block of every option. A word like -5m or -1 after an option is its value (one argparse
    would read as an unknown flag unless it is a plain number), so the option's own check can say what is wrong."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE  # argparse's hook for values that start with '-'

    def error(self, message: str) -> NoReturn:
        where, _, said = message.partition(": ")
        if where.startswith("argument ") and said.startswith("--"):  # the message names the flag already
            message = said
        err_console.print(f"[bold red]error:[/] {escape(message)} (see `{self.prog} --help`)", highlight=False,
                          soft_wrap=True)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="perflab",
        description="A profile-first performance lab for PyTorch training and inference.",
    )
    parser.add_argument("--version", action="version", version=f"perflab {__version__}")
    parser.add_argument("--debug", action="store_true", default=False, help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(subparsers)
    for subparser in subparsers.choices.values():  # `perflab run ... --debug` works too
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


DEBUG_HELP = ("on an error, print the full Python traceback (torch and perflab frames included), not only the "
              "frames of your own files; also PERFLAB_DEBUG=1")


def debug_enabled(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("PERFLAB_DEBUG", "") not in ("", "0")


def print_error(err: PerflabError, debug: bool) -> None:
    """The error's message; with debug, the full traceback (and what caused it) first."""
    if debug:  # an out-of-memory's tracebacks were let go of, to free the step's memory: their kept text
        err_console.print(escape(kept_traceback(err)), highlight=False, soft_wrap=True, markup=True)
    prefix = "" if isinstance(err, OutOfMemoryFailure) else "[bold red]error:[/] "  # its block says what it is
    err_console.print(f"{prefix}{escape(str(err))}", highlight=False, soft_wrap=True)


def main(argv: Optional[list[str]] = None) -> int:
    from perflab.cli._script import split_script_command  # cli/_script imports this module's consoles
    parser = build_parser()
    full_argv = list(sys.argv[1:] if argv is None else argv)
    own_argv, script_command = split_script_command(full_argv)
    args = parser.parse_args(own_argv)
    args.argv = full_argv  # recorded in results, so runs can be repeated
    args.script_command = script_command
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    if script_command is not None and not getattr(args, "runs_scripts", False):
        err_console.print("[bold red]error:[/] `--` runs a script only with `perflab run` or `perflab profile`, "
                          "e.g. `perflab profile -- python train.py`", highlight=False)
        return 2
    if argv is not None:  # called from Python: the caller's process is not this command's to manage
        return handle(args)
    from perflab.cli._process import as_process  # signal and exit handling: only where perflab is the process
    return as_process(lambda: handle(args), rank=bool(getattr(args, "rank_mode", False)))


def handle(args: argparse.Namespace) -> int:
    """Run the parsed command; a user mistake, a file-system error or an interrupt is one line and an exit code."""
    try:
        return int(args.handler(args) or 0)
    except PerflabError as err:
        print_error(err, debug_enabled(args))
        return getattr(err, "exit_code", 2)
    except OSError as err:  # a full disk, a path too long, no permission: the path and the cause, in one line
        line = os_error_line(err, target=getattr(args, "out", None))
        print_error(PerflabError(line).with_traceback(err.__traceback__), debug_enabled(args))
        return 2
    except KeyboardInterrupt as err:
        err_console.print(f"[yellow]interrupted[/] ({interrupt_name(err)}): nothing partial was saved as a result")
        return 130
    except (WorkloadExited, SystemExit) as err:
        if isinstance(err, SystemExit) and not _from_user_code(err):  # perflab's own exit
            raise
        err_console.print(f"[bold red]error:[/] {escape(exit_message(err))}", highlight=False, soft_wrap=True)
        return WorkloadExited.exit_code


def _from_user_code(err: BaseException) -> bool:
    from perflab.user_frames import user_frames  # imports perflab and torch
    return bool(user_frames(err))


if __name__ == "__main__":
    sys.exit(main())

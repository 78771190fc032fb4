"""Run options for run, profile and sweep, derived from RunConfig's option declarations (perflab/options.py)."""
from __future__ import annotations

import argparse

from perflab import options
from perflab.config import RunConfig
from perflab.distributed.rank import RANK_MODE_FLAG


def add_run_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add every RunConfig option `command` takes; a sweep takes comma-separated lists (a grid)."""
    options.add_arguments(parser, RunConfig, command)
    if command in ("run", "profile", "serve"):
        parser.add_argument("--overwrite", action="store_true",
                            help="reuse an --out directory that already holds a run: empty it first")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """A RunConfig from single-valued options; unspecified options keep RunConfig's defaults."""
    return RunConfig(**options.changes_from_args(RunConfig, args, args.command)).validate()


def grid_from_args(args: argparse.Namespace) -> tuple[list[RunConfig], list[str]]:
    """Expand comma-separated options into the grid of RunConfigs, and name the swept fields."""
    return options.grid_from_args(RunConfig, args, "sweep")


def gave_run_options(args: argparse.Namespace) -> bool:
    """True when any run option was given on the command line."""
    return bool(options.changes_from_args(RunConfig, args, args.command))


def add_rank_mode(parser: argparse.ArgumentParser) -> None:
    """The hidden flag of the ranks perflab starts itself (perflab/distributed/launch.py); not for users."""
    parser.add_argument(RANK_MODE_FLAG, dest="rank_mode", action="store_true", help=argparse.SUPPRESS)

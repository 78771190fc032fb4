"""perflab run: measure one configuration and save runs/<id>/result.json."""
from __future__ import annotations

import argparse
import contextlib

from perflab.cli import console, err_console
from perflab.cli._options import add_rank_mode, add_run_options, config_from_args
from perflab.cli._outcome import finish_run
from perflab.cli._script import EPILOG, handle_script
from perflab.harness.progress import Reporter
from perflab.pipeline import resolve_config, run
from perflab.report.progress import RichReporter
from perflab.results.rundir import run_dir
from perflab.ranks import is_primary
from perflab.distributed.rank import run_as_rank
from perflab.ranks import needs_launch


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="measure a workload (or your script: -- python train.py): "
                                   "throughput, latency, breakdown, MFU",
                                   description="Measure a workload and save runs/<id>/result.json. With --nproc N, "
                                               "N ranks measure together (torchrun underneath; docs/distributed.md).",
                                   epilog=EPILOG)
    add_run_options(parser, "run")
    add_rank_mode(parser)
    parser.set_defaults(handler=handle, runs_scripts=True)


def handle(args: argparse.Namespace) -> int:
    if args.script_command is not None:
        return handle_script(args, capture=None)
    if args.rank_mode:
        return run_rank(config_from_args(args), args)
    cfg = resolve_config(config_from_args(args), None)
    with run_dir(args.out, cfg.workload, args.overwrite, cfg.resume_from) as out, \
            launcher_or_rich_reporter(cfg) as reporter:
        result = run(cfg.workload, cfg.replace(out=str(out)), reporter=reporter, command=["perflab"] + args.argv)
        if result is None:
            console.print("this node's ranks finished; node 0 writes the result in its --out")
            return 0
        result.save(out)
    return finish_run(console, err_console, result, out)


def run_rank(cfg, args: argparse.Namespace) -> int:
    """One rank of `perflab run --nproc N`: measure, and on rank 0 save the gathered result (the launcher prints).
    The launcher passes a resolved --device, so the process group can pick this rank's GPU before anything
    touches CUDA."""
    def body() -> None:
        primary = is_primary()
        with rank_reporter(primary) as reporter:
            result = run(cfg.workload, cfg, reporter=reporter, command=["perflab"] + args.argv)
        if primary:
            result.save(args.out)
    return run_as_rank(cfg.device, body)


def rank_reporter(primary: bool):
    """Rank 0 draws the progress bar; the other ranks stay quiet."""
    return RichReporter(console) if primary else contextlib.nullcontext(Reporter())


def launcher_or_rich_reporter(cfg):
    """A progress bar, unless this process only launches ranks (rank 0 draws theirs on the same terminal)."""
    return contextlib.nullcontext(Reporter()) if needs_launch(cfg) else RichReporter(console)

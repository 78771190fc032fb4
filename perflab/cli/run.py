"""perflab run: measure one configuration and save runs/<id>/result.json."""
from __future__ import annotations

import argparse

from perflab.cli import console, err_console
from perflab.cli._options import add_run_options, config_from_args
from perflab.cli._outcome import finish_run
from perflab.cli._script import EPILOG, handle_script
from perflab.harness.runner import resolve_config, run
from perflab.report.progress import RichReporter
from perflab.rundir import run_dir


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="measure a workload (or your script: -- python train.py): "
                                   "throughput, latency, breakdown, MFU",
                                   description="Measure a workload and save runs/<id>/result.json.", epilog=EPILOG)
    add_run_options(parser, "run")
    parser.set_defaults(handler=handle, runs_scripts=True)


def handle(args: argparse.Namespace) -> int:
    if args.script_command is not None:
        return handle_script(args, capture=None)
    cfg = resolve_config(config_from_args(args), None)
    with run_dir(args.out, cfg.workload, args.overwrite, cfg.resume_from) as out, RichReporter(console) as reporter:
        result = run(cfg.workload, cfg.replace(out=str(out)), reporter=reporter, command=["perflab"] + args.argv)
        result.save(out)
    return finish_run(console, err_console, result, out)

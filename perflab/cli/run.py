"""perflab run: measure one configuration and save runs/<id>/result.json."""
from __future__ import annotations

import argparse

from rich.markup import escape

from perflab.checkpoint import checkpoint_hooks
from perflab.cli import console
from perflab.cli._options import add_run_options, config_from_args
from perflab.cli._script import EPILOG, handle_script
from perflab.harness.runner import resolve_config, run
from perflab.profile.nsys import nsys_hooks
from perflab.report.progress import RichReporter
from perflab.report.terminal import print_result
from perflab.rundir import run_dir


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="measure a workload (or your script: -- python train.py): "
                                   "throughput, latency, breakdown, MFU",
                                   description="Measure a workload and save runs/<id>/result.json.", epilog=EPILOG)
    add_run_options(parser)
    parser.set_defaults(handler=handle, runs_scripts=True)


def handle(args: argparse.Namespace) -> int:
    if args.script_command is not None:
        return handle_script(args, capture=None)
    cfg = resolve_config(config_from_args(args), None)
    with run_dir(args.out, cfg.workload) as out, RichReporter(console) as reporter:
        result = run(cfg.workload, cfg.replace(out=str(out)), reporter=reporter, command=["perflab"] + args.argv,
                     hooks=list(checkpoint_hooks(cfg, out)) + nsys_hooks(args.nsys))
        result.save(out)
    print_result(console, result)
    if result.quality and result.quality.get("verdict") == "fail":
        console.print(f"[bold red]quality gate failed[/]: {escape(result.quality['reason'])}; the result is "
                      "saved (tolerances: docs/quality.md)", highlight=False)
        return 1
    return 0

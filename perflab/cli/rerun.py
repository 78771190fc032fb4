"""perflab rerun RESULT.json: repeat a run from its recorded config (same seed), then compare with it."""
from __future__ import annotations

import argparse

from rich.markup import escape

from perflab.cli import console
from perflab.compare import compare_results, load_result
from perflab.compare.reproduction import REPRODUCED, reproduction
from perflab.config import ScriptConfig
from perflab.errors import PerflabError
from perflab.pipeline import run
from perflab.report.progress import RichReporter
from perflab.report.terminal import print_result
from perflab.results.rundir import run_dir


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rerun", help="repeat a saved run from its recorded config and seed, and compare with it",
        description="Repeat a run from the config recorded in its result.json (workload, levers, batch, seed, "
                    "steps, trials...), save it as a new run, and say whether it reproduced the original.")
    parser.add_argument("result", metavar="RESULT", help="a result.json or the run directory holding it")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="run directory for the repeat (default: runs/<timestamp>-<workload>)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    original = load_result(args.result)
    if isinstance(original.config, ScriptConfig):
        raise PerflabError(f"{original.path} measured a script: repeat it with `{' '.join(original.command)}`")
    cfg = original.config.run_config().replace(out=None).validate()
    console.print(f"rerunning {original.path} (seed {cfg.seed}, recorded {original.created_utc or 'n/a'})",
                  highlight=False)
    with run_dir(args.out, cfg.workload) as out, RichReporter(console) as reporter:
        result = run(cfg.workload, cfg.replace(out=str(out)), reporter=reporter,
                     command=["perflab", "rerun", str(args.result)])
        result.notes.append(f"rerun of {original.path}")
        result.save(out)
    print_result(console, result)
    comparison = compare_results(original, result)
    for warning in comparison.warnings:
        console.print(f"[bold red]WARNING:[/] {warning}", highlight=False)
    verdict, why = reproduction(comparison)
    change = comparison.metric("throughput").change_pct
    style = "green" if verdict == REPRODUCED else "yellow"
    console.print(f"vs the original: throughput {'n/a' if change is None else f'{change:+.1f}%'}: "
                  f"[{style}]{verdict}[/]; {escape(why)}", highlight=False)
    return 0

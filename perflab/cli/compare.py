"""perflab compare BASE CANDIDATE: the performance report, a decision, and an exit code for CI."""
from __future__ import annotations

import argparse

from rich.markup import escape

from perflab import options
from perflab.cli import console
from perflab.compare import INCONCLUSIVE, NOT_JUDGED, compare_paths, regression_exceeds
from perflab.config import JudgeConfig
from perflab.errors import writing
from perflab.report.compare_table import print_comparison
from perflab.results.rundir import run_dir
from perflab.report.build import write_report


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="baseline vs candidate: changes with confidence intervals and a decision",
        description="Compare two runs (run directories or result.json files): throughput, p50/p95 latency, GPU "
                    "utilisation, peak memory, MFU and quality, each change with a 95% bootstrap confidence "
                    "interval, then accept | reject | no significant change. Saves compare.json.")
    parser.add_argument("base", metavar="BASE", help="the baseline run (directory or result.json)")
    parser.add_argument("candidate", metavar="CANDIDATE", help="the candidate run (directory or result.json)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where compare.json goes (default: runs/<timestamp>-compare)")
    options.add_option(parser, options.Option("--fail-on-regression", float, "exit 1 when throughput is "
                                              "significantly lower by more than PCT percent (CI gate); timings "
                                              "that were not judged never fail it: add --fail-on-not-judged for "
                                              "that", "compare", minimum=0, metavar="PCT"))
    parser.add_argument("--report", action="store_true", help="also write report.md and report.html in --out")
    parser.add_argument("--overwrite", action="store_true", help="reuse an --out directory that already holds a "
                        "comparison: empty it first")
    options.add_arguments(parser, JudgeConfig, "compare")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    judging = JudgeConfig(**options.changes_from_args(JudgeConfig, args, "compare"))
    options.validate(judging)
    comparison = compare_paths(args.base, args.candidate, judging.min_effect_pct, judging.accept_noisy)
    with run_dir(args.out, "compare", args.overwrite) as out, writing(out, "the comparison"):
        path = comparison.save(out)
        files = []
        if args.report:
            files = write_report(out)
    print_comparison(console, comparison)
    console.print(f"saved [bold]{path}[/]" + "".join(f", {f}" for f in files))
    if args.fail_on_regression is not None and comparison.noisy and not comparison.accept_noisy:
        console.print("[yellow]regression gate: not judged, the timings are contaminated[/] (" +
                      "; ".join(comparison.noisy) + "); re-run on a quiet machine or add --accept-noisy",
                      highlight=False)
    if args.fail_on_regression is not None and regression_exceeds(comparison, args.fail_on_regression):
        change = comparison.metric("throughput").change_pct
        console.print(f"[bold red]regression gate: throughput {change:+.1f}% is a significant slow-down beyond "
                      f"{args.fail_on_regression:g}%[/]")
        return 1
    if comparison.decision in (NOT_JUDGED, INCONCLUSIVE):
        console.print(f"[yellow]{comparison.decision}[/]: {escape(comparison.reasons[0])}", highlight=False,
                      soft_wrap=True)
        return 1 if judging.fail_on_not_judged else 0
    return 0

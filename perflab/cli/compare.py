"""perflab compare BASE CANDIDATE: the performance report, a decision, and an exit code for CI."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.panel import Panel
from rich.table import Table

from perflab.cli import console
from perflab.errors import writing
from perflab.compare import MIN_EFFECT_PCT, Comparison, compare_paths, regression_exceeds
from perflab.report.terminal import fmt
from perflab.rundir import run_dir

DECISION_STYLE = {"accept": "bold green", "reject": "bold red", "no significant change": "bold yellow"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="baseline vs candidate: changes with confidence intervals and a decision",
        description="Compare two runs (run directories or result.json files): throughput, p50/p95 latency, GPU "
                    "utilisation, peak memory, MFU and quality, each change with a 95%% bootstrap confidence "
                    "interval, then accept | reject | no significant change. Saves compare.json.")
    parser.add_argument("base", metavar="BASE", help="the baseline run (directory or result.json)")
    parser.add_argument("candidate", metavar="CANDIDATE", help="the candidate run (directory or result.json)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where compare.json goes (default: runs/<timestamp>-compare)")
    parser.add_argument("--fail-on-regression", type=float, default=None, metavar="PCT",
                        help="exit 1 when throughput is significantly lower by more than PCT percent (CI gate)")
    parser.add_argument("--min-effect", type=float, default=MIN_EFFECT_PCT, metavar="PCT",
                        help=f"smallest throughput change that counts as a win or a loss (default: {MIN_EFFECT_PCT:g})")
    parser.add_argument("--report", action="store_true", help="also write report.md and report.html in --out")
    parser.add_argument("--overwrite", action="store_true", help="reuse an --out directory that already holds a "
                        "comparison: empty it first")
    parser.add_argument("--accept-noisy", action="store_true",
                        help="judge the speed even when a run was taken on a busy machine or did not finish cleanly")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    comparison = compare_paths(args.base, args.candidate, args.min_effect, args.accept_noisy)
    out_arg = args.out or str(Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-compare")
    with run_dir(out_arg, "compare", args.overwrite) as out, writing(out, "the comparison"):
        path = comparison.save(out)
        files = []
        if args.report:
            from perflab.report.build import write_report
            files = write_report(out)
    print_comparison(comparison)
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
    return 0


def _value(value, unit: str) -> str:
    digits = 2 if unit in ("ms/step",) else 1
    return fmt(value, digits)


def print_comparison(comparison: Comparison) -> None:
    for warning in comparison.warnings:
        console.print(Panel(f"[bold]{warning}[/]", title="WARNING", border_style="red"), highlight=False)
    table = Table(title=f"performance report · base: {comparison.base['label']} · candidate: "
                        f"{comparison.candidate['label']}", title_justify="left")
    for column in ("metric", "baseline", "candidate", "change", "95% CI of change", "significant"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for m in comparison.metrics:
        change = "n/a" if m.change_pct is None else f"{m.change_pct:+.1f}%"
        interval = "—" if m.ci_low_pct is None else f"{m.ci_low_pct:+.1f}% … {m.ci_high_pct:+.1f}%"
        significant = {True: "yes", False: "no", None: "—"}[m.significant]
        if m.significant:
            significant = "[green]yes (better)[/]" if m.improved else "[red]yes (worse)[/]"
        table.add_row(f"{m.name} ({m.unit})", _value(m.base, m.unit), _value(m.candidate, m.unit), change,
                      interval, significant)
    quality = comparison.quality
    table.add_row("quality", quality["base_verdict"], quality["verdict"], "", "", quality["reason"])
    table.caption = "CI: " + comparison.method
    console.print(table)
    if comparison.config_changes:
        console.print("changed: " + "; ".join(f"{k} {v[0]} → {v[1]}" for k, v in comparison.config_changes.items()),
                      highlight=False)
    phases = [p for p in comparison.phases if abs(p["delta_ms"]) > 0.0005][:5]
    if phases:
        console.print("phases that account for the difference (ms/step): " + ", ".join(
            f"{p['phase']} {p['delta_ms']:+.3f}" for p in phases), highlight=False)
    if comparison.kernels:
        console.print("kernels (ms/step): " + ", ".join(f"{k['kernel'][:40]} {k['delta_ms']:+.3f}"
                                                        for k in comparison.kernels[:5]), highlight=False)
    else:
        console.print(f"[dim]{comparison.kernel_note}[/]")
    style = DECISION_STYLE[comparison.decision]
    body = "\n".join(f"• {reason}" for reason in comparison.reasons)
    console.print(Panel(body, title=f"decision: {comparison.decision.upper()}", border_style=style.split()[-1],
                        title_align="left"), highlight=False)

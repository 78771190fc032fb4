"""perflab sweep: run a grid of configurations (comma lists) or --auto-batch, one saved point at a time."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from perflab import options
from perflab.cli import console, err_console
from perflab.cli._options import add_run_options, gave_run_options, grid_from_args
from perflab.cli._outcome import points_out_of_memory
from perflab.errors import PerflabError, writing
from perflab.report.plots import sweep_plots
from perflab.report.sweep_table import print_sweep_summary
from perflab.report.terminal import fmt
from perflab.results import read_json_object
from perflab.results.rundir import out_path
from perflab.sweep import SWEEP_JSON, SweepObserver, SweepPoint, read_rows, run_auto_batch, run_sweep
from perflab.cli import build_parser
from perflab.options import Option

SWEEP = "sweep"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="run a grid of configs (comma lists) or --auto-batch; plots and the best point",
        description="Run every combination of the comma-separated options (e.g. --batch 8,16,32 --precision "
                    "fp32,bf16). Each finished point is appended to <out>/sweep.jsonl at once; an "
                    "out-of-memory point is recorded as 'oom' and the sweep goes on; --resume skips finished "
                    "points. Plots throughput, p50/p95 latency and peak memory against the batch size.")
    add_run_options(parser, "sweep")
    group = parser.add_argument_group(SWEEP)
    group.add_argument("--out", default=None, metavar="DIR",
                       help="sweep directory (default: runs/<timestamp>-sweep)")
    group.add_argument("--auto-batch", action="store_true",
                       help="double the batch (from --batch or the workload default) until out of memory or "
                            "throughput grows by less than --growth-pct")
    options.add_option(group, Option("--growth-pct", float, "auto-batch stops when doubling gains less than this "
                                     "(default: 5)", SWEEP, 5.0, minimum=0, metavar="PCT"))
    options.add_option(group, Option("--max-auto-batch", int, "auto-batch upper bound: the batch is not doubled past "
                                     "N (default: 4096; formerly --max-batch)", SWEEP, 4096, minimum=1, metavar="N",
                                     deprecated=("--max-batch",)))
    options.add_option(group, Option("--max-p95-ms", float, "also name the fastest point whose p95 step latency is "
                                     "at most MS", SWEEP, above=0, metavar="MS"))
    group.add_argument("--resume", action="store_true",
                       help="continue the sweep in --out, skipping finished points; with no other options, "
                            "the options recorded in --out are used")
    parser.set_defaults(handler=handle)


class RichSweepProgress(SweepObserver):
    """One bar over points; each finished point printed as a line above it."""

    def __init__(self):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task("sweep", total=None)

    def __enter__(self) -> "RichSweepProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def begin(self, total: Optional[int], already_done: int) -> None:
        self.progress.update(self.task, total=total)
        if already_done:
            self.progress.console.print(f"[dim]resuming: {already_done} point(s) already done[/]")

    def point_started(self, label: str) -> None:
        self.progress.update(self.task, description=f"sweep: {label}")

    def point_finished(self, row: SweepPoint, reused: bool) -> None:
        self.progress.advance(self.task)
        self.progress.console.print(f"  {row.label}: {_status_text(row)}" + (" [dim](recorded)[/]" if reused else ""),
                                    highlight=False)


def _status_text(point: SweepPoint) -> str:
    if point.ok:
        return f"{fmt(point.throughput)} samples/s, p95 {fmt(point.p95_ms, 2)} ms"
    return f"[red]{point.status}[/]: {point.error or ''}"


def _gave_sweep_options(args: argparse.Namespace) -> bool:
    return gave_run_options(args) or args.auto_batch or args.max_p95_ms is not None


def recorded_sweep_args(args: argparse.Namespace) -> Optional[tuple[argparse.Namespace, list[str]]]:
    """`--resume --out DIR` alone: the options of the sweep recorded in DIR/sweep.json, and its command."""
    if not args.resume or args.out is None or _gave_sweep_options(args):
        return None
    meta_path = Path(args.out) / SWEEP_JSON
    if not meta_path.is_file():
        raise PerflabError(f"--resume: {args.out} holds no sweep (no {SWEEP_JSON}); check --out")
    command = read_json_object(meta_path, "a sweep record", "give the sweep's options again with --resume").get(
        "command") or []
    if command[1:2] != ["sweep"]:
        raise PerflabError(f"--resume: {meta_path} does not record how the sweep was started; "
                           "give the sweep's options again with --resume")
    restored = build_parser().parse_args(command[1:])
    restored.resume, restored.out = True, args.out
    return restored, _with_out(command, args.out)


def _with_out(command: list[str], out: str) -> list[str]:
    """The recorded command with --out naming the folder being resumed (a copied or moved sweep names its old one)."""
    kept, words = [], iter(command)
    for word in words:
        if word == "--out":
            next(words, None)
        elif not word.startswith("--out="):
            kept.append(word)
    return [*kept, "--out", out]


def handle(args: argparse.Namespace) -> int:
    command = ["perflab"] + args.argv
    recorded = recorded_sweep_args(args)
    if recorded is not None:
        args, command = recorded
        console.print(f"[dim]resuming with the recorded options: {' '.join(command[1:])}[/]", highlight=False)
    configs, axes = grid_from_args(args)
    out = out_path(args.out, "sweep")
    common = dict(resume=args.resume, max_p95_ms=args.max_p95_ms, command=command, plots=sweep_plots)
    try:
        with RichSweepProgress() as progress, writing(out, "the sweep"):
            if args.auto_batch:
                if "batch_size" in axes:
                    raise PerflabError("--auto-batch doubles the batch itself; give at most one --batch (the start)")
                summary = run_auto_batch(configs, out, args.growth_pct, args.max_auto_batch, axes=axes,
                                         observer=progress, **common)
            else:
                summary = run_sweep(configs, out, axes=axes, observer=progress, **common)
    except KeyboardInterrupt:
        done = len(read_rows(out)) if (out / "sweep.jsonl").exists() else 0
        err_console.print(f"[yellow]interrupted[/]: {done} finished point(s) are kept in {out}/sweep.jsonl; "
                          f"run `perflab sweep --resume --out {out}` to continue")
        return 130
    print_sweep_summary(console, summary)
    if not args.auto_batch:  # --auto-batch grows until one does not fit, by design
        code = points_out_of_memory(err_console, [point.to_dict() for point in summary.rows])
        if code is not None:
            return code
    failed = [point for point in summary.rows if point.status in ("error", "invalid")]
    if summary.rows and len(failed) == len(summary.rows):
        raise PerflabError(f"every point failed; the first: {summary.rows[0].error}")
    if failed:
        err_console.print(f"[yellow]{len(failed)} of {len(summary.rows)} point(s) failed or diverged[/] (status "
                          "error/invalid in the table); the others are kept", highlight=False)
        return 1
    return 0

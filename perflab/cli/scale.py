"""perflab scale: the same run at --nproc 1,2,... ranks, with throughput per rank and scaling efficiency."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from perflab.cli import console, err_console
from perflab.cli._options import add_run_options, grid_from_args
from perflab.cli._outcome import points_out_of_memory
from perflab.cli.sweep import RichSweepProgress
from perflab import options
from perflab.sweep.point import ScaleRow
from perflab.sweep.predict import PredictConfig, Prediction
from perflab.sweep.scale import ScaleSummary, at_rank_counts, run_scale, trusted_efficiency
from perflab.results.rundir import out_path
from perflab.errors import PerflabError
from perflab.report.fit import Column, fitted_tables
from perflab.report.plots import scaling_plots, sweep_plots
from perflab.report.terminal import fmt
from perflab.sweep import read_rows


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "scale", help="run at --nproc 1,2,... ranks: throughput per rank and scaling efficiency",
        description="Run the same configuration at each --nproc in the list (the 1-rank run is added when "
                    "missing) and compute scaling efficiency = throughput(N) / (N x throughput(1)). Saved like "
                    "a sweep (sweep.jsonl, points/, --resume), plus scale.json, scaling.csv and two plots. "
                    "Other options may be lists too (e.g. --parallel ddp,fsdp). See docs/distributed.md.")
    add_run_options(parser, "sweep")
    group = parser.add_argument_group("scale")
    group.add_argument("--out", default=None, metavar="DIR", help="directory (default: runs/<timestamp>-scale)")
    group.add_argument("--resume", action="store_true", help="continue in --out, skipping finished points")
    options.add_arguments(parser, PredictConfig, "scale")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    model = PredictConfig(**options.changes_from_args(PredictConfig, args, "scale"))
    options.validate(model)
    if model.predict is None and model != PredictConfig():
        raise PerflabError("--gpus-per-node, --intra-node-gbps and the --inter-node-* settings are the scaling "
                           "model's: add --predict N,M,...")
    if model.predict is not None:
        model.counts()  # a bad list is refused before anything runs
    counts = rank_counts(args.nproc)
    # the grid is validated at the largest count (DDP settings need ranks); the 1-rank points drop them
    args.nproc = str(max(counts))
    configs = at_rank_counts(grid_from_args(args)[0], counts)
    out = out_path(args.out, "scale")
    try:
        with RichSweepProgress() as progress:
            summary = run_scale(configs, out, resume=args.resume, observer=progress, command=["perflab"] + args.argv,
                                plots=sweep_plots, scaling_plots=scaling_plots,
                                predict=model if model.predict is not None else None)
    except KeyboardInterrupt:
        done = len(read_rows(out)) if (out / "sweep.jsonl").exists() else 0
        err_console.print(f"[yellow]interrupted[/]: {done} finished point(s) are kept in {out}; run `perflab scale "
                          f"--resume --out {out}` with the same options to continue")
        return 130
    print_scaling(summary)
    if summary.predictions or summary.assumptions:
        print_predictions(summary)
    code = points_out_of_memory(err_console, [row.to_dict() for row in summary.rows])
    if code is not None:
        return code
    if not any(row.ok for row in summary.rows):
        raise PerflabError(f"every point failed; the first: {summary.rows[0].error}")
    failed = [row.label for row in summary.rows if row.ok and row.quality == "fail"]
    if failed:  # as `perflab run` does: a measured point that computes something else is not a result
        console.print(f"[bold red]quality gate failed[/] at {', '.join(failed)}; the points are saved", highlight=False)
        return 1
    return 0


def rank_counts(text) -> list[int]:
    """--nproc 1,2,4 -> [1, 2, 4]."""
    if text is None:
        raise PerflabError("perflab scale needs --nproc with the rank counts to compare, e.g. --nproc 1,2")
    try:
        counts = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise PerflabError(f"--nproc {text}: give rank counts like 1,2,4") from None
    if not counts or counts[0] < 1:
        raise PerflabError(f"--nproc {text}: rank counts must be positive integers, like 1,2,4")
    return counts


def print_scaling(summary: ScaleSummary) -> None:
    """The table of ranks, throughput, throughput per rank and efficiency; failed points; the files."""
    params = [name for name in dict.fromkeys(n for row in summary.rows for n in row.params) if name != "nproc"]
    headers = ["ranks"] + [name.replace("_size", "") for name in params] + ["status (quality)", "samples/s",
                                                                              "per rank", "efficiency", "p50 ms"]
    rows = []
    for row in summary.rows:
        rows.append([str(row.world_size), *[str(row.params.get(name)) for name in params], _status(row),
                     fmt(row.throughput) if row.ok else "", fmt(row.per_rank_throughput) if row.ok else "",
                     _efficiency(row), fmt(row.p50_ms, 2) if row.ok else ""])
    console.print(fitted_tables(f"scale · {summary.sweep.out}", [Column(header) for header in headers], rows,
                                console.width))
    for row in summary.rows:
        if not row.ok:
            console.print(f"[red]{row.label}[/]: {row.error}", highlight=False)
        for flag in row.flags:
            console.print(f"[yellow]{row.label}[/]: {flag}", highlight=False)
    for path in summary.plots.values():
        console.print(f"plot: {summary.sweep.out / path}")
    console.print(f"saved [bold]{summary.sweep.out}/scale.json[/], scaling.csv and the sweep files")


def _status(row: ScaleRow) -> str:
    """ok, with the point's quality verdict when it has one: "ok (fail)" is a point that ran but computes wrong."""
    return f"{row.status} ({row.quality})" if row.ok and row.quality else row.status


def _efficiency(row: ScaleRow) -> str:
    """The efficiency as a figure only when it can be trusted; the flags under the table say why not."""
    trusted = trusted_efficiency(row)
    if row.efficiency_pct is None:
        return ""
    return f"{trusted:.1f}%" if trusted is not None else "untrusted"


def overlap_tax_sources(predictions: list[Prediction]) -> dict[str, str]:
    """Each recipe's overlap tax source once, named by its wrapper (and its settings where a wrapper has several)."""
    recipes = {json.dumps(prediction.recipe and asdict(prediction.recipe), sort_keys=True): prediction
               for prediction in predictions}
    wrappers = [prediction.parallel for prediction in recipes.values()]
    sources = {}
    for key, prediction in recipes.items():
        name = prediction.parallel if wrappers.count(prediction.parallel) == 1 else f"{prediction.parallel} {key}"
        sources[name] = prediction.overlap_tax or "none"
    return sources


def print_predictions(summary: ScaleSummary) -> None:
    """The scaling model's table (predicted beside measured efficiency), the overlap tax of each recipe and where it
    came from, and the links it assumed."""
    headers = ("parallel", "GPUs", "nodes x GPUs", "busbw GB/s", "comm ms", "exposed ms", "tax ms", "step ms",
               "predicted", "without tax", "measured")
    rows = []
    for prediction in summary.predictions:
        measured = prediction.measured_efficiency_pct
        rows.append([prediction.parallel, str(prediction.gpus), f"{prediction.nodes} x {prediction.gpus_per_node}",
                     fmt(prediction.busbw_gbps, 1), fmt(prediction.communication_ms, 2),
                     fmt(prediction.exposed_ms, 2), fmt(prediction.overlap_tax_ms, 2), fmt(prediction.step_ms, 2),
                     f"{prediction.efficiency_pct:.1f}%", f"{prediction.efficiency_without_tax_pct:.1f}%",
                     f"{measured:.1f}%" if measured is not None else ""])
    console.print(fitted_tables("scaling model (--predict)", [Column(header) for header in headers], rows,
                                console.width, key_columns=2))  # a row is a recipe at a GPU count
    for recipe, source in overlap_tax_sources(summary.predictions).items():
        console.print(f"overlap tax, {recipe}: {source}", highlight=False)
    for what, source in summary.assumptions.items():
        console.print(f"assumed, {what}: {source}", highlight=False)

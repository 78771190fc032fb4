"""perflab serve: LoadGen scenarios (server, offline, single-stream) through a dynamic batcher, with tail latency."""
from __future__ import annotations

import argparse

from rich.markup import escape

from perflab import options
from perflab.cli import console, err_console
from perflab.cli._options import add_run_options
from perflab.cli._outcome import finish_run
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.report.progress import RichReporter
from perflab.report.serve_table import point_row, print_serve
from perflab.results.metrics import LoadPoint
from perflab.results.rundir import run_dir
from perflab.serve import ServeConfig, serve, serve_run_config
from perflab.workloads.plugin import is_plugin_spec, plugin_name


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="load a model as MLPerf LoadGen does: Poisson arrivals, a dynamic batcher, p99, max QPS",
        description="Serve a workload (inference, with its levers) under a LoadGen scenario: server (seeded Poisson "
                    "arrivals at --qps, or --find-max-qps under --p99-ms), offline (every query at once) or "
                    "single-stream (one at a time). A dynamic batcher (--batcher-max-batch, --batch-timeout-ms) reads "
                    "the arrivals off the seeded schedule (no thread issues queries) and feeds --instances model "
                    "copies. Each point is saved to <out>/result.json as it finishes; Ctrl-C keeps finished points. "
                    "Levers that change numerics get the quality gate after the points (as in "
                    "perflab run); a failed gate saves the result and exits 1. See docs/serve.md.")
    add_run_options(parser, "serve")
    options.add_arguments(parser, ServeConfig, "serve")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.mode == "train":
        raise PerflabError("perflab serve measures inference; --mode train cannot be served (drop --mode)")
    # serve always infers: inference-only options (--kv-cache, --slo, ...) are checked as such
    run_cfg = RunConfig(**{**options.changes_from_args(RunConfig, args, "serve"), "mode": "infer"}).validate()
    serve_cfg = ServeConfig(**options.changes_from_args(ServeConfig, args, "serve")).validate()
    cfg = serve_run_config(run_cfg, serve_cfg)
    finished: list[dict] = []

    def show(point: LoadPoint) -> None:
        finished.append(point)
        cells = point_row(point)
        reasons = point.validity.reasons if point.validity is not None else []
        console.print(f"  point {cells[0]}: {cells[1]} q/s offered ({cells[2]} realised), {cells[3]} achieved, p99 "
                      f"{cells[6]} ms, batch {cells[8]}: {cells[-1]}"
                      + (f" ({escape('; '.join(reasons))})" if reasons else "")
                      + (f"; ran {point.extended.last_query_s:.1f} s, past --duration, for "
                         f"{escape(point.extended.why)}" if point.extended else ""), highlight=False)

    name = plugin_name(cfg.workload) if is_plugin_spec(cfg.workload) else cfg.workload
    with run_dir(cfg.out, f"serve-{name}", args.overwrite) as out, RichReporter(console) as reporter:
        console.print(f"[dim]serving {escape(cfg.workload)} ({serve_cfg.scenario}) into {out}: warm-up, the harness's "
                      "own capacity, then the points[/]", highlight=False)
        try:
            result = serve(run_cfg.replace(out=str(out)), serve_cfg, out, on_point=show,
                           command=["perflab"] + args.argv, reporter=reporter)
        except KeyboardInterrupt:
            if not finished:
                raise  # nothing finished: run_dir removes the directory it created
            err_console.print(f"[yellow]interrupted[/]: {len(finished)} finished point(s) are kept in "
                              f"{out}/result.json")
            return 130
    print_serve(console, result)
    if result.quality and not result.quality.failed:
        console.print(f"quality gate: {escape(result.quality.verdict)} ({escape(result.quality.reason)})",
                      highlight=False)
    return finish_run(console, err_console, result, out)

"""perflab workloads | levers | env | calibrate: what is available and what this machine can do."""
from __future__ import annotations

import argparse
from typing import Optional

from rich.markup import escape
from rich.table import Table

from perflab.calibrate import cache_error, datasheet_ceilings, measure_ceilings, measured_ceilings, store_ceilings
from perflab.cli._collectives import handle_collectives
from perflab.distributed.rank import RANK_MODE_FLAG
from perflab.cli import console
from perflab.environment import collect_environment
from perflab.errors import PerflabError
from perflab.pipeline import resolve_device
from perflab.levers import all_levers
from perflab.report.levers_table import print_levers
from perflab.workloads import builtin_descriptions, builtin_settings
from perflab.workloads.settings import describe


def register(subparsers) -> None:
    workloads = subparsers.add_parser("workloads", help="list the built-in workloads")
    workloads.set_defaults(handler=handle_workloads)
    levers = subparsers.add_parser("levers", help="list the optimisation levers, what each needs and addresses")
    levers.set_defaults(handler=handle_levers)
    env = subparsers.add_parser("env", help="report the environment: torch, CUDA, GPU, CPU, ceilings")
    env.set_defaults(handler=handle_env)
    cal = subparsers.add_parser("calibrate", help="measure this machine's ceilings (matmul, memory, H2D) once")
    cal.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    cal.add_argument("--quick", action="store_true", help="smaller sizes: faster, slightly lower peaks")
    cal.add_argument("--collectives", action="store_true", help="measure all-reduce, reduce-scatter and all-gather "
                     "between --nproc ranks of this node (1 MiB to 1 GiB on GPUs): algorithm and bus bandwidth as "
                     "nccl-tests reports them, cached for the diagnosis and `perflab scale --predict`")
    cal.add_argument("--nproc", type=int, default=None, metavar="N", help="--collectives: ranks (GPUs) to measure "
                     "between (default: every visible GPU)")
    cal.add_argument("--max-mb", type=float, default=None, metavar="MB", help="--collectives: the largest message "
                     "in MiB (default: 1024)")
    cal.add_argument("--out", default=None, help=argparse.SUPPRESS)  # rank mode: where rank 0 writes the entry
    cal.add_argument(RANK_MODE_FLAG, dest="rank_mode", action="store_true", help=argparse.SUPPRESS)
    cal.set_defaults(handler=handle_calibrate)


def handle_workloads(args: argparse.Namespace) -> int:
    table = Table(title="built-in workloads", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("description and --option KEY=VALUE settings")
    settings = builtin_settings()
    for name, description in builtin_descriptions().items():
        lines = [escape(description)] + [f"  [dim]{escape(describe(option))}[/]" for option in settings[name]]
        table.add_row(name, "\n".join(lines))
    console.print(table)
    console.print("Your own: --workload path/to/file.py:build or package.module:build (see README).")
    return 0


def handle_levers(args: argparse.Namespace) -> int:
    print_levers(console, all_levers())
    return 0


def handle_env(args: argparse.Namespace) -> int:
    device = resolve_device("auto")
    env = collect_environment(device)
    table = Table(title="environment", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in env.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
        table.add_row(key, str(value))
    ceilings = measured_ceilings(device)
    sheet = datasheet_ceilings(device)
    if ceilings:
        table.add_row("ceilings", _ceilings_text(ceilings.tflops, ceilings.memory_gbps)
                      + f" (calibrated {ceilings.measured_utc})")
    elif sheet:
        table.add_row("ceilings", _ceilings_text(sheet, None) + " (datasheet)")
    else:
        table.add_row("ceilings", "not measured: run `perflab calibrate`")
    console.print(table)
    return 0


def _ceilings_text(tflops: dict, memory_gbps: Optional[float]) -> str:
    parts = [f"{k} {_tflops_text(v) if v is not None else 'not supported'}" for k, v in tflops.items()
             if k in ("fp32", "tf32", "bf16", "fp16")]
    text = "matmul TFLOP/s: " + ", ".join(parts)
    if memory_gbps:
        text += f"; memory {memory_gbps:.0f} GB/s"
    return text


def handle_calibrate(args: argparse.Namespace) -> int:
    if args.collectives or args.rank_mode:
        return handle_collectives(args)
    if args.nproc is not None or args.max_mb is not None:
        raise PerflabError("--nproc and --max-mb are settings of `perflab calibrate --collectives`; add --collectives")
    device = resolve_device(args.device)
    with console.status("calibrating") as status:
        ceilings = measure_ceilings(device, quick=args.quick,
                                    progress=lambda msg: status.update(f"calibrating: {msg}"))
    table = Table(title=f"ceilings of {ceilings.device}", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("measured")
    for precision, value in ceilings.tflops.items():
        text = (f"not supported here ({ceilings.unsupported[precision]})" if value is None
                else f"{_tflops_text(value)} TFLOP/s ({ceilings.matmul_size}^3)")
        table.add_row(f"matmul {precision}", text)
    table.add_row("device memory copy", f"{ceilings.memory_gbps:.1f} GB/s (read + write)")
    for label, gbps in (("h2d pinned", ceilings.h2d_pinned_gbps), ("h2d pageable", ceilings.h2d_pageable_gbps)):
        if gbps is not None:
            table.add_row(label, f"{gbps:.1f} GB/s")
    console.print(table)
    try:
        cached = store_ceilings(ceilings)
    except OSError as err:
        raise PerflabError(f"{cache_error(err)}: the figures above were measured but not cached; set "
                           "PERFLAB_CACHE_DIR to a writable directory and run calibrate again") from None
    console.print(cached, highlight=False)
    return 0


def _tflops_text(value: float) -> str:
    """Three significant digits: a CPU's 0.004 TFLOP/s must not print as 0.00."""
    return f"{value:.2f}" if value >= 10 else f"{value:.3g}"

"""perflab memory: one step profiled for memory: the peak by category, the largest batch, what each lever frees."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from perflab import options
from perflab.cli import console, err_console
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.memory.search import Probe, search_bound
from perflab.memory.step import LIMIT_ENV, measure_step
from perflab.memory.study import MemoryStudy, memory_study
from perflab.pipeline import load, out_of_memory_as_result, resolve_config, resolve_device, with_breakdown_advice
from perflab.report.build import write_report
from perflab.results.rundir import run_dir

DESCRIPTION = (
    "Profile one training or inference step for memory (the run's levers apply; timing options are ignored). "
    "Prints the peak broken down into parameters, gradients, optimizer state, activations saved for backward, "
    "inputs, temporaries and allocator slack (reserved - allocated), the module whose activations are largest, "
    "the peak predicted at any batch (fixed + per-sample part, fitted at a quarter, a half and all of --batch), and "
    "what each memory lever would free with the batch it would then allow. --find-max-batch also finds the largest "
    "batch that fits, each probe in its own process (grow, then bisect). Saves memory.json, report.md, report.html "
    "(with the memory-over-the-step plot) and, on CUDA, memory_snapshot.pickle for https://pytorch.org/memory_viz "
    "in runs/memory-<workload>/. See docs/memory.md.")


def register(subparsers) -> None:
    parser = subparsers.add_parser("memory", help="what uses the memory at the peak of a step, the largest batch "
                                   "that fits, and what each lever would free", description=DESCRIPTION)
    options.add_arguments(parser, RunConfig, "run")  # the run's options: the same workload, batch and levers
    group = parser.add_argument_group("memory")
    group.add_argument("--find-max-batch", action="store_true",
                       help="find the largest batch that fits: each probe in its own process, growing from the "
                            "fit's prediction, then bisecting to within 2%%")
    options.add_option(group, options.Option("--memory-limit-mb", float, f"treat MB as the memory there is: a peak "
                                             f"over it counts as out of memory (tests, headroom; also {LIMIT_ENV}); "
                                             "default: the device's memory", "memory", above=0, metavar="MB"))
    options.add_option(group, options.Option("--fsdp-gpus", int, "the GPUs the FSDP estimate shards model states "
                                             "over (default: 8)", "memory", 8, minimum=1, metavar="N"))
    group.add_argument("--overwrite", action="store_true", help="reuse an --out directory: empty it first")
    group.add_argument("--probe", metavar="FILE", default=None, help=argparse.SUPPRESS)  # one search probe
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    cfg = resolve_config(RunConfig(**options.changes_from_args(RunConfig, args, "run")).validate(), None)
    if cfg.nproc > 1:
        raise PerflabError("perflab memory profiles one process; drop --nproc (the FSDP estimate uses --fsdp-gpus)")
    device = resolve_device(cfg.device)
    if args.probe:
        with out_of_memory_as_result(cfg, device, ["perflab"] + args.argv, advise=False):  # the search's answer
            breakdown = measure_step(cfg, categorise=device.type == "cpu", limit_mb=args.memory_limit_mb,
                                     count_autocast=False)  # a probe reads the peak alone
        Path(args.probe).write_text(json.dumps({"batch": cfg.batch_size, "peak_mb": breakdown.peak_mb}))
        return 0
    name = Path(cfg.workload.split(":")[0]).stem if ":" in cfg.workload else cfg.workload
    workload = load(None, cfg)
    supported = workload.supports_activation_checkpointing if cfg.mode == "train" else None
    dataset_items = None if workload.repeat_items else len(workload.dataset)
    with run_dir(args.out, f"memory-{name}", args.overwrite) as out:
        saved, command = cfg.replace(out=str(out)), ["perflab"] + args.argv
        with with_breakdown_advice(saved, device, command), out_of_memory_as_result(saved, device, command):
            study = memory_study(cfg, out, args.find_max_batch, args.memory_limit_mb, args.fsdp_gpus, supported,
                                 ["perflab"] + args.argv, dataset_items=dataset_items,
                                 note=lambda text: console.print(f"[dim]{escape(text)}[/]"), on_probe=_show_probe)
        write_report(out)
    print_study(study)
    console.print(f"saved {escape(str(out))}: memory.json, report.html"
                  + (", memory_snapshot.pickle (https://pytorch.org/memory_viz)" if study.files.get("snapshot") else ""),
                  highlight=False)
    return 0


def _show_probe(probe: Probe) -> None:
    figure = f"peak {probe.peak_mb:,.1f} MiB" if probe.peak_mb is not None else "[red]out of memory[/]"
    console.print(f"  probe batch {probe.batch}: {figure}", highlight=False)


def _mb(value) -> str:
    return "—" if value is None else f"{round(value, 1) + 0.0:,.1f}"  # + 0.0: no "-0.0" for a change that rounds to 0


def print_study(study: MemoryStudy) -> None:
    breakdown = study.breakdown
    table = Table(title=f"memory at the peak of one {breakdown.mode} step, batch {breakdown.batch_size} "
                        f"({breakdown.device})")
    table.add_column("category")
    table.add_column("MiB", justify="right")
    table.add_column("share", justify="right")
    for label, mb in breakdown.rows():
        table.add_row(label, _mb(mb), f"{100 * mb / breakdown.peak_mb:.0f}%" if breakdown.peak_mb else "")
    table.add_row("[bold]measured peak[/]", f"[bold]{_mb(breakdown.peak_mb)}[/]", "")
    console.print(table)
    console.print(f"[dim]categories: {escape(breakdown.source)}; peak: {escape(breakdown.peak_source)}[/]")
    largest = breakdown.largest_module()
    if largest:
        console.print(f"largest activations: [bold]{escape(largest[0])}[/] ({largest[1]:,.1f} MiB saved for backward)",
                      highlight=False)
    if study.fit is not None:
        fit = study.fit
        console.print(f"peak ≈ {fit.fixed_mb:,.1f} MiB + {fit.per_sample_mb:,.3f} MiB × batch (batches "
                      f"{', '.join(map(str, fit.batches))}); capacity {_mb(study.capacity_mb)} MiB; predicted largest "
                      f"batch {study.predicted_largest_batch or '—'}", highlight=False)
    if study.search is not None:
        search = study.search
        predicted = study.fit.predict_mb(search.largest_fits) if study.fit and search.largest_fits else None
        bound = search_bound(search.limited_by, search.smallest_oom)
        console.print(f"largest batch that fits (measured): [bold]{search.largest_fits}[/] ({escape(bound)}); peak "
                      f"there {_mb(search.largest_peak_mb)} MiB measured, {_mb(predicted)} MiB predicted",
                      highlight=False)
    if study.levers:
        levers = Table(title="what each lever would free")
        for column in ("lever", "frees MiB", "peak MiB", "batch it allows"):
            levers.add_column(column, justify="left" if column == "lever" else "right")
        for lever in study.levers:
            levers.add_row(lever.lever, _mb(lever.frees_mb), _mb(lever.predicted_peak_mb),
                           str(lever.batch_allowed or "—"))
        console.print(levers)
        for lever in study.levers:
            note = f"; {lever.note}" if lever.note else ""
            console.print(f"  {escape(lever.lever)}: {escape(lever.how)}{escape(note)}", highlight=False,
                          soft_wrap=True)
    for note in breakdown.notes:
        err_console.print(f"[yellow]note[/]: {escape(note)}", highlight=False)

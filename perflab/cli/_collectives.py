"""perflab calibrate --collectives: start N ranks, measure the collectives between them, cache and print the figures."""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from rich.table import Table

from perflab.calibrate_collectives import (KINDS, MIB, CollectivesCalibration, measure_collectives, message_sizes,
                                           peer_link, store_collectives)
from perflab.cli import console
from perflab.config import RunConfig
from perflab.distributed.launch import start_ranks
from perflab.distributed.rank import RANK_MODE_FLAG, local_rank, run_as_rank
from perflab.errors import PerflabError
from perflab.pipeline import resolve_device


def handle_collectives(args: argparse.Namespace) -> int:
    """The launcher side (ranks started through torchrun), or, in rank mode, one rank's measurement."""
    if args.rank_mode:
        return _rank(args)
    device = resolve_device(args.device)
    ranks = args.nproc if args.nproc is not None else (torch.cuda.device_count() if device.type == "cuda" else 2)
    if ranks < 2:
        raise PerflabError(f"--collectives measures between ranks: use --nproc 2 or more (got {ranks}"
                           f"{' visible GPU' if args.nproc is None else ''})")
    with tempfile.TemporaryDirectory(prefix="perflab-collectives-") as folder:
        out = Path(folder) / "collectives.json"
        rank_args = ["calibrate", "--collectives", "--device", device.type, "--out", str(out)]
        rank_args += ["--quick"] if args.quick else []
        rank_args += ["--max-mb", str(args.max_mb)] if args.max_mb is not None else []
        with console.status(f"measuring collectives over {ranks} ranks"):
            start_ranks(RunConfig(nproc=ranks, device=device.type), [*rank_args, RANK_MODE_FLAG])
        entry = CollectivesCalibration.from_dict(json.loads(out.read_text()))
    print_collectives(entry, store_collectives(entry))
    return 0


def _rank(args: argparse.Namespace) -> int:
    def body() -> None:
        import torch.distributed as dist
        device = torch.device("cuda", local_rank()) if args.device == "cuda" else torch.device("cpu")
        entry = measure_collectives(device, message_sizes(device, args.quick, args.max_mb))
        if dist.get_rank() == 0:
            entry.link = peer_link(device)
            Path(args.out).write_text(json.dumps(entry.to_dict()))
    return run_as_rank(args.device, body)


def print_collectives(entry: CollectivesCalibration, cached: str) -> None:
    """One table per kind (size, time, algorithm and bus bandwidth), the peaks against the link's nominal figure,
    and where the entry was cached."""
    table = Table(title=f"collectives · {entry.device} · {entry.backend}", title_justify="left")
    for column in ("collective", "size", "time µs", "algbw GB/s", "busbw GB/s"):
        table.add_column(column, justify="right")
    for kind in KINDS:
        for row in entry.results.get(kind, []):
            size = row.bytes
            table.add_row(kind, f"{size / MIB:g} MiB" if size >= MIB else f"{size / 1024:g} KiB",
                          f"{row.time_us:.1f}", _gbps(row.algbw_gbps), _gbps(row.busbw_gbps))
    console.print(table)
    peaks = ", ".join(f"{kind} {_gbps(value)}" for kind, value in entry.peak_busbw_gbps.items())
    console.print(f"peak bus bandwidth (GB/s): {peaks}", highlight=False)
    link = entry.link
    if link:
        console.print(f"nominal link: {link.name} {link.gbps:g} GB/s; the all-reduce's bus bandwidth is "
                      f"{100 * entry.peak_busbw_gbps['all_reduce'] / link.gbps:.0f}% of it", highlight=False)
    console.print(cached, highlight=False)


def _gbps(value: float) -> str:
    """Three significant digits: gloo's 0.004 GB/s must not print as 0.00."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"

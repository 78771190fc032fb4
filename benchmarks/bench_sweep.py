"""Area "sweep": the seed 000/001 sweeps through perflab.sweep, with their reports (issue 5).

- resnet50 inference, batch 8..512, fp32 vs bf16 + channels-last: throughput/latency/memory curves, the
  best point, and a compare report of the two variants at batch 256;
- driving training over batch x DataLoader workers x pinned memory (seed 000's worker/pin table).

Everything lands under --out: <sweep>/sweep.jsonl|csv, the PNG plots, report.md and report.html.
With --quick or without CUDA the sizes are tiny (a CPU check of the machinery, not a measurement).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.common import Rows, parse_args
from perflab.compare import compare_paths
from perflab.config import RunConfig
from perflab.report.build import write_report
from perflab.report.plots import sweep_plots
from perflab.sweep import SweepObserver, SweepPoint, SweepSummary, run_sweep


class PrintProgress(SweepObserver):
    def __init__(self, name: str):
        self.name = name

    def point_finished(self, row: SweepPoint, reused: bool) -> None:
        value = f"{row.throughput:.1f} samples/s, p95 {row.p95_ms:.2f} ms" if row.ok else f"{row.status}: {row.error}"
        print(f"[sweep] {self.name} {row.label}: {value} ({row.elapsed_s or 0:.1f}s)", flush=True)


def record(rows: Rows, name: str, summary: SweepSummary) -> None:
    for row in summary.rows:
        if row.ok:
            rows.add(name, f"throughput {row.label}", row.throughput, "samples/s",
                     f"p50 {row.p50_ms:.2f} ms, p95 {row.p95_ms:.2f} ms, peak {row.peak_memory_mb:.0f} MiB")
        else:
            rows.add(name, f"status {row.label}", None, "", f"{row.status}: {row.error}")
    if summary.best:
        rows.add(name, "best point", summary.best.throughput, "samples/s", summary.best.label)


def resnet50_sweep(out: Path, rows: Rows, small: bool) -> SweepSummary:
    batches = [2, 4] if small else [8, 16, 32, 64, 128, 256, 512]
    common = dict(workload="resnet50", mode="infer", steps=3 if small else 15, warmup=1 if small else 5,
                  trials=2 if small else 3, workload_options={"image_res": 32} if small else {})
    variants = [dict(precision="fp32"), dict(precision="bf16", channels_last=True)]
    configs = [RunConfig(batch_size=batch, **common, **variant) for variant in variants for batch in batches]
    began = time.perf_counter()
    summary = run_sweep(configs, out / "resnet50_infer", max_p95_ms=None if small else 50.0,
                        observer=PrintProgress("resnet50_infer"), command=["benchmarks/bench_sweep.py"],
                        plots=sweep_plots)
    write_report(summary.out)
    rows.add("resnet50_infer", "sweep wall time", time.perf_counter() - began, "s", f"{len(summary.rows)} points")
    record(rows, "resnet50_infer", summary)
    if summary.best_under_bound:
        rows.add("resnet50_infer", "best with p95 <= 50 ms", summary.best_under_bound.throughput, "samples/s",
                 summary.best_under_bound.label)
    return summary


def resnet50_compare(summary: SweepSummary, out: Path, rows: Rows, batch: int) -> None:
    """fp32 vs bf16 + channels-last at one batch size, from the sweep's own point results."""
    points = {row.config.precision: row for row in summary.rows if row.ok and row.config.batch_size == batch}
    if not {"fp32", "bf16"} <= set(points):
        rows.add("resnet50_compare", "status", None, "", f"batch {batch} missing from the sweep")
        return
    comparison = compare_paths(summary.out / points["fp32"].dir, summary.out / points["bf16"].dir)
    target = out / "resnet50_compare"
    target.mkdir(parents=True, exist_ok=True)
    comparison.save(target)
    write_report(target)
    throughput = comparison.metric("throughput")
    rows.add("resnet50_compare", f"bf16+channels-last vs fp32 at batch {batch}", throughput.change_pct, "%",
             f"{comparison.decision}; CI {throughput.ci_low_pct:+.1f}%..{throughput.ci_high_pct:+.1f}%")


def driving_sweep(out: Path, rows: Rows, small: bool, cuda: bool) -> SweepSummary:
    base = RunConfig(workload="driving", mode="train", data="loader", steps=3 if small else 20,
                     warmup=1 if small else 5, trials=2, workload_options={"image_res": 64} if small else {})
    workers = [0, 2] if small else [0, 4, 8]
    pins = [False, True] if cuda else [False]
    configs = [base.replace(batch_size=batch, workers=w, pin_memory=pin)
               for batch in ([4, 8] if small else [16, 32]) for w in workers for pin in pins]
    began = time.perf_counter()
    summary = run_sweep(configs, out / "driving_train", observer=PrintProgress("driving_train"),
                        command=["benchmarks/bench_sweep.py"], plots=sweep_plots)
    write_report(summary.out)
    rows.add("driving_train", "sweep wall time", time.perf_counter() - began, "s", f"{len(summary.rows)} points")
    record(rows, "driving_train", summary)
    return summary


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = Rows("sweep", args.out)
    cuda = torch.cuda.is_available()
    small = args.quick or not cuda
    if not cuda:
        torch.set_num_threads(1)  # a small shared CPU: OpenMP threads spinning against each other cost 10-50x
    summary = resnet50_sweep(args.out, rows, small)
    resnet50_compare(summary, args.out, rows, batch=4 if small else 256)
    driving_sweep(args.out, rows, small, cuda)


if __name__ == "__main__":
    main()

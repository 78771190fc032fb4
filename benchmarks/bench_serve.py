"""Area "serve": perflab serve on the GPU, as MLPerf LoadGen measures inference (issue 10).

    python -m benchmarks.bench_serve --out DIR [--quick]

For resnet50 (bf16 + channels-last + torch.compile) and the transformer workload (bf16 + compile, seq_len 256):
- offline: every query at once, full batches on two instances: the samples/s ceiling;
- server: seeded Poisson arrivals, the max QPS whose p99 latency is at most 15 ms (widen, then bisect to 10%);
  the ratio server / offline is the figure LoadGen's submitters quote (NVIDIA's H100 TensorRT ResNet-50
  entry: 82%; the goal here: 85% or more);
- the load generator's and batcher's own capacity with a no-op model (they must not be the bottleneck);
- the latency-vs-load plot of each search, copied to latency_vs_load_<workload>.png, and each run's report.

Every serve run's result.json, report.md and plots land under --out. Without CUDA (or with --quick) sizes and
durations shrink so the area checks the machinery in about a minute (no compile on a CPU).
"""
from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.report.build import write_report
from perflab.serve import ServeConfig, serve

P99_BOUND_MS = 15.0


@dataclass
class ServeExperiment:
    """One workload with its levers: an offline run at `offline_batch`, a max-QPS search at `server_batch`."""

    workload: str
    levers: dict[str, Any]
    offline_batch: int
    server_batch: int
    options: dict[str, str] = field(default_factory=dict)
    p99_ms: float = P99_BOUND_MS


def experiments(full: bool) -> list[ServeExperiment]:
    if not full:  # a CPU check of the machinery: small models, no compile, a CPU-sized bound
        return [ServeExperiment("mlp", {}, 32, 16, p99_ms=200.0),
                ServeExperiment("transformer", {}, 8, 4, p99_ms=200.0)]
    return [ServeExperiment("resnet50", {"precision": "bf16", "channels_last": True, "compile": "default"}, 256, 64),
            ServeExperiment("transformer", {"precision": "bf16", "compile": "default"}, 64, 32,
                            {"seq_len": "256"})]


def run_one(experiment: ServeExperiment, serve_cfg: ServeConfig, out: Path, full: bool):
    cfg = RunConfig(workload=experiment.workload, device="cuda" if full else "auto", warmup=3 if full else 1,
                    workload_options=dict(experiment.options), **experiment.levers)
    began = time.perf_counter()
    result = serve(cfg, serve_cfg, out, command=["benchmarks/bench_serve.py"])
    write_report(out)
    return result, time.perf_counter() - began


def measure(experiment: ServeExperiment, out: Path, rows: Rows, full: bool) -> None:
    name = experiment.workload
    timing = dict(duration_s=2.0, min_queries=1000) if full else dict(duration_s=0.5, min_queries=50)
    offline, offline_s = run_one(experiment, ServeConfig(scenario="offline", max_batch=experiment.offline_batch,
                                                         instances=2, **timing), out / f"{name}_offline", full)
    point = offline.metrics["serve"]["points"][0]
    offline_qps = point["achieved_qps"]
    rows.add(name, f"offline samples/s (max batch {experiment.offline_batch}, 2 instances)", offline_qps,
             "samples/s", f"p99 {point['latency_ms']['p99']:.1f} ms; session {offline_s:.0f} s incl. compile")

    search = ServeConfig(find_max_qps=True, p99_ms=experiment.p99_ms, max_batch=experiment.server_batch,
                         batch_timeout_ms=2.0, instances=2, search_tolerance_pct=10.0,
                         duration_s=1.0 if full else 0.5, min_queries=500 if full else 50)
    server, server_s = run_one(experiment, search, out / f"{name}_server", full)
    record = server.metrics["serve"]
    max_qps = record["max_qps"]
    at_max = max((p for p in record["points"] if p["passed"]), key=lambda p: p["offered_qps"], default=None)
    note = (f"p99 {at_max['latency_ms']['p99']:.2f} ms, mean batch {at_max['batch_mean']:.1f}, instances busy "
            f"{at_max['instance_busy_pct']:.0f}%, GPU {(at_max.get('gpu') or {}).get('util_mean_pct')}%"
            if at_max else "no rate met the bound")
    rows.add(name, f"server max QPS at p99 <= {experiment.p99_ms:g} ms (max batch {experiment.server_batch}, "
             f"timeout 2 ms, 2 instances)", max_qps, "queries/s",
             f"{note}; {len(record['search']['tried'])} points; session {server_s:.0f} s "
             f"{record['search'].get('skipped') or ''}")
    rows.add(name, "server / offline", 100 * max_qps / offline_qps if max_qps and offline_qps else None, "%",
             "goal >= 85% (LoadGen's H100 TensorRT ResNet-50 entry: 82%)")
    capacity = record["capacity"]
    rows.add(name, "load generator capacity (no-op model)", capacity["loadgen_issue_qps"], "queries/s",
             f"batcher {capacity['batcher_qps_at_max_batch']:.0f} queries/s at max batch, "
             f"{capacity['batcher_batches_per_s']:.0f} batches/s")
    behind = [p["offered_qps"] for p in record["points"] if p["behind_schedule"]]
    if behind:
        rows.add(name, "points where the load generator fell behind", len(behind), "points", str(behind))
    diagnosis = server.diagnosis or {}
    rows.add(name, "diagnosis of the search", None, "", f"{diagnosis.get('bottleneck')}: {diagnosis.get('headline')}")
    plot = out / f"{name}_server" / "serve_latency_vs_load.png"
    if plot.is_file():
        shutil.copy(plot, out / f"latency_vs_load_{name}.png")


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = Rows("serve", args.out)
    cuda = torch.cuda.is_available()
    full = cuda and not args.quick
    if not cuda:
        torch.set_num_threads(1)
    for experiment in experiments(full):
        try:
            measure(experiment, args.out, rows, full)
        except Exception as err:  # one workload failing must not lose the other's rows
            traceback.print_exc()
            rows.add(experiment.workload, "status", None, "", f"failed: {type(err).__name__}: {err}"[:300])


if __name__ == "__main__":
    main()

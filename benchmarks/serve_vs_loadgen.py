"""perflab serve's own load generator beside MLCommons LoadGen (`--loadgen`) on one model whose every batch takes a
fixed time, so the true answers are known: offline throughput max_batch / service time, and at a rate well inside
capacity a p99 near two service times.

    python -m benchmarks.serve_vs_loadgen [--service-ms 20] [--max-batch 32] [--duration 2] [--min-queries 1024]

Needs the `loadgen` extra (pip install 'perflab[loadgen]'). Prints one Markdown table: each scenario and rate, with
perflab's figures and verdict and LoadGen's figures and verdict of the same kind of run (a separate run: the two do
not share queries), and writes every run's result.json (and LoadGen's logs) under --out."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from perflab.config import RunConfig
from perflab.results.metrics import LoadPoint
from perflab.serve import ServeConfig, serve
from perflab.serve.capacity import FixedTimeEngine


def run(out: Path, service_s: float, loadgen: bool, **settings) -> dict:
    """One serve run with the fixed-time model; its single point."""
    name = f"{settings.get('scenario', 'server')}-{settings.get('qps') or 'offline'}-{'lg' if loadgen else 'own'}"
    result = serve(RunConfig(workload="mlp", device="cpu", warmup=1), ServeConfig(loadgen=loadgen, **settings),
                   out / name, engines=[FixedTimeEngine(service_s)])
    return result.metrics.serve.points[0]


def own_cells(point: LoadPoint) -> list[str]:
    verdict = "VALID" if point.validity is not None and point.validity.valid else "INVALID"
    rate = point.achieved_qps
    return [f"{rate:,.0f}", f"{point.latency_ms['p99']:.1f}", f"{point.queries:,}", verdict]


def loadgen_cells(point: LoadPoint) -> list[str]:
    judged = point.loadgen
    rate = judged.get("samples_per_s") or judged.get("completed_samples_per_s")
    return [f"{rate:,.0f}", f"{judged['p99_ms']:.1f}", f"{judged['query_count']:,}", judged["validity"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--min-queries", type=int, default=1024)
    parser.add_argument("--rates", default="600,1000,1300,1500,1800")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="serve-vs-loadgen-"))
    service_s = args.service_ms / 1000
    common = dict(p99_ms=args.p99_ms, max_batch=args.max_batch, batch_timeout_ms=2, duration_s=args.duration,
                  min_queries=args.min_queries)
    runs = [("offline", None, dict(scenario="offline"))]
    runs += [("server", rate, dict(qps=rate)) for rate in args.rates.split(",")]
    print(f"model: every batch takes {args.service_ms:g} ms (max batch {args.max_batch}: at most "
          f"{args.max_batch / service_s:,.0f} queries/s); p99 bound {args.p99_ms:g} ms; --duration {args.duration:g} "
          f"s, --min-queries {args.min_queries}\n")
    print("| scenario | offered q/s | perflab q/s | perflab p99 ms | perflab queries | perflab verdict | "
          "LoadGen q/s | LoadGen p99 ms | LoadGen queries | LoadGen verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scenario, rate, settings in runs:
        own = run(out, service_s, False, **common, **settings)
        judged = run(out, service_s, True, **common, **settings)
        offered = "all at once" if rate is None else f"{float(rate):,.0f}"
        print(f"| {scenario} | {offered} | " + " | ".join(own_cells(own) + loadgen_cells(judged)) + " |", flush=True)
    print(f"\nresults under {out}")


if __name__ == "__main__":
    main()

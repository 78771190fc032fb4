"""Which batcher settings and levers serve resnet50 best on this GPU? Offline and server max QPS per variant.

    python -m benchmarks.serve_variants --out DIR

A companion of bench_serve: the same serve() calls over a few variants (CUDA graphs instead of compile, one or
two instances, max batch, timeout), one line each, so the settings bench_serve uses are chosen by measurement.
"""
from __future__ import annotations

import time
import traceback

from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.serve import ServeConfig, serve

BASE = {"precision": "bf16", "channels_last": True}
VARIANTS = [
    # label, run levers, offline max batch, server max batch, timeout ms, instances
    ("graphs 1 inst mb32 t1", {**BASE, "cuda_graphs": True}, 128, 32, 1.0, 1),
    ("graphs 2 inst mb32 t1", {**BASE, "cuda_graphs": True}, 128, 32, 1.0, 2),
    ("graphs 1 inst mb64 t2", {**BASE, "cuda_graphs": True}, 256, 64, 2.0, 1),
    ("compile 1 inst mb32 t1", {**BASE, "compile": "default"}, 128, 32, 1.0, 1),
]


def main() -> None:
    args = parse_args()
    rows = Rows("serve_variants", args.out)
    for label, levers, offline_batch, server_batch, timeout_ms, instances in VARIANTS:
        try:
            cfg = RunConfig(workload="resnet50", device="cuda", warmup=3, **levers)
            began = time.perf_counter()
            offline = serve(cfg, ServeConfig(scenario="offline", max_batch=offline_batch, instances=instances,
                                             duration_s=2.0, min_queries=1000), args.out / f"{label}-offline")
            point = offline.metrics.serve.points[0]
            rows.add(label, "offline samples/s", point.achieved_qps, "samples/s",
                     f"max batch {offline_batch}, {instances} inst, parts {point.time_ms.get('mean')}")
            search = serve(cfg, ServeConfig(find_max_qps=True, p99_ms=15.0, max_batch=server_batch,
                                            batch_timeout_ms=timeout_ms, instances=instances, duration_s=1.0,
                                            min_queries=500, search_tolerance_pct=10.0), args.out / f"{label}-server")
            record = search.metrics.serve
            rows.add(label, "server max QPS p99<=15ms", record.max_qps, "queries/s",
                     f"single query {record.single_query_ms} ms; {time.perf_counter() - began:.0f} s")
        except Exception as err:
            traceback.print_exc()
            rows.add(label, "status", None, "", f"failed: {type(err).__name__}: {err}"[:300])


if __name__ == "__main__":
    main()

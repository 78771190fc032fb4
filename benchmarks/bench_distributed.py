"""Distributed area (2 GPUs: the device kind nvidia-h200-x2): scaling efficiency, exposed communication and
the DDP bucket size, through `perflab scale` / `perflab profile --nproc 2` (torchrun underneath).

    python -m benchmarks.bench_distributed --out DIR [--quick]

- resnet50 train bf16, DDP at 1 and 2 GPUs: throughput per GPU and scaling efficiency (goal >= 95%)
- transformer train bf16, DDP and FSDP2 at 1 and 2 GPUs: the same
- profiled at 2 GPUs: NCCL time per step, % overlapped with compute, exposed share of the step, for resnet50
  DDP at --ddp-bucket-mb 1, 25 (DDP's default), 100, and the transformer with DDP and FSDP
- planted collectives-bound case (tests/planted/big_gradients.py: 4 x 8192^2 weights on batch 8): diagnosed

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 unless already set).
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import Rows, parse_args
from perflab import RunConfig
from perflab.sweep.scale import run_scale
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions

ROOT = Path(__file__).resolve().parent.parent
AREA = "distributed"
PROFILE = CaptureOptions(wait=2, warmup=2, active=3, record_shapes=False, gzip=True)
PLANTED = str(ROOT / "tests" / "planted" / "big_gradients.py") + ":build"


def measure(quick: bool) -> dict[str, Any]:
    return dict(steps=15 if quick else 30, warmup=5 if quick else 10, trials=2 if quick else 3)


def scaling(rows: Rows, out: Path, name: str, base: list[RunConfig]) -> None:
    """One `perflab scale` over 1 and 2 GPUs for each config in `base`; rows per point."""
    summary = run_scale([cfg.replace(nproc=2) for cfg in base], out / name)
    for row in summary.rows:
        label = f"{name} {row['label']}"
        if row["status"] != "ok":
            rows.add(label, "status", None, note=f"{row['status']}: {row.get('error')}"[:300])
            continue
        rows.add(label, "throughput", row["throughput"], "samples/s")
        rows.add(label, "throughput_per_gpu", row["per_rank_throughput"], "samples/s")
        if row["world_size"] > 1:
            goal = " (goal >= 95%)" if name.startswith("resnet50") else ""
            rows.add(label, "scaling_efficiency", row["efficiency_pct"], "%", note=f"throughput(2) / (2 x throughput(1)){goal}")


def profiled(rows: Rows, out: Path, name: str, cfg: RunConfig, expected: str = "") -> None:
    """`perflab profile --nproc 2`: throughput and the worst rank's communication figures, and the verdict."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    began = time.time()
    try:
        result, diagnosis, _ = profile_run(cfg.workload, resolve_config(cfg, None), run_dir, PROFILE)
    except Exception as err:  # one failing experiment must not lose the others' rows
        rows.add(name, "status", None, note=f"failed: {type(err).__name__}: {err}"[:300])
        return
    rows.add(name, "throughput", result.throughput, "samples/s", note=f"profiled run, {time.time() - began:.0f}s")
    comm = result.metrics.collectives
    if comm:
        rows.add(name, "nccl_ms_per_step", comm["communication_ms_per_step"], "ms")
        rows.add(name, "overlap", comm["overlap_pct"], "%", note="NCCL time under compute kernels")
        rows.add(name, "exposed_share_of_step", comm["exposed_share_pct"], "%",
                 note=f"{comm['exposed_ms_per_step']:.2f} ms/step, worst rank {comm.get('worst_rank')}")
    spread = result.metrics.distributed.straggler_spread_pct if result.metrics.distributed else None
    rows.add(name, "straggler_spread", spread, "%")
    if diagnosis is not None:
        match = "" if not expected else (" (expected)" if diagnosis.bottleneck == expected else f" (EXPECTED {expected})")
        rows.add(name, "verdict_confidence", diagnosis.confidence,
                 note=f"{diagnosis.bottleneck}{match}: {diagnosis.headline}; levers: {', '.join(diagnosis.levers)}"[:300])


def run(out: Path, quick: bool) -> list[dict]:
    rows = Rows(AREA, out)
    if torch.cuda.device_count() < 2:
        rows.add("(area)", "status", None, note=f"needs 2 GPUs, {torch.cuda.device_count()} visible")
        return rows.rows
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    common = dict(device="cuda", mode="train", precision="bf16", **measure(quick))
    resnet = RunConfig(workload="resnet50", batch_size=128, **common)
    transformer = RunConfig(workload="transformer", batch_size=16, **common)
    scaling(rows, out, "resnet50 ddp", [resnet])
    scaling(rows, out, "transformer", [transformer, transformer.replace(parallel="fsdp")])
    buckets = (25.0,) if quick else (1.0, 25.0, 100.0)
    for bucket_mb in buckets:
        profiled(rows, out, f"resnet50 ddp bucket {bucket_mb:g} MiB",
                 resnet.replace(nproc=2, ddp_bucket_mb=bucket_mb, trials=2))
    for parallel in ("ddp", "fsdp"):
        profiled(rows, out, f"transformer {parallel}", transformer.replace(nproc=2, parallel=parallel, trials=2))
    profiled(rows, out, "planted big gradients", RunConfig(workload=PLANTED, nproc=2, batch_size=8, steps=12, warmup=3,
                                                           trials=1, device="cuda"), expected="collectives")
    return rows.rows


def main() -> int:
    args = parse_args()
    began = time.time()
    run(args.out, args.quick)
    print(f"[{AREA}] done in {time.time() - began:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Diagnose area: profile every planted-bottleneck workload and the seed workloads, record the verdicts, write
small gzipped traces ready to commit as test fixtures, and measure the cost of the perflab markers.

    python -m benchmarks.bench_diagnose --out DIR [--quick]

DIR/<name>/                     the run: result.json, trace.json.gz, diagnosis.json, nsys_command.txt
DIR/fixtures/<slug>__<name>.json.gz (+ .result.json)   copy to tests/fixtures/traces/gpu/ (or cpu/)
"""
from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from benchmarks.common import Rows, parse_args
from perflab import RunConfig
from perflab.diagnose import CLASS_SLUGS
from perflab.hooks import StepHook
from perflab.pipeline import profile_run, resolve_config
from perflab.pipeline import run as perflab_run
from perflab.profile.capture import CaptureOptions
from perflab.profile.markers import mark, no_mark

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ROOT / "tests" / "planted"
CUDA = torch.cuda.is_available()

# (fixture name "<slug>__<what>", workload file, config changes)
PLANTED_RUNS = [
    ("input_pipeline__sleep_loader", "slow_loader.py", dict(batch_size=32, workload_options={"work": "sleep"})),
    ("input_pipeline__cpu_loader", "slow_loader.py", dict(batch_size=16, workload_options={"work": "cpu"})),
    ("h2d__pageable_inputs", "pageable_inputs.py", dict(batch_size=64, pin_memory=False)),
    ("launch__tiny_ops", "tiny_ops.py", dict(batch_size=1)),
    ("sync__item_after_layer", "item_sync.py",
     dict(batch_size=512 if CUDA else 64, mode="infer" if CUDA else "train")),
    ("sync__cpu_per_block", "cpu_sync_per_block.py", dict(batch_size=512 if CUDA else 64, mode="infer")),
    ("sync__nonzero_router", "nonzero_router.py",
     dict(batch_size=512 if CUDA else 64, mode="infer" if CUDA else "train")),
    ("memory_bandwidth__elementwise_chain", "elementwise_chain.py", dict(batch_size=32 if CUDA else 8)),
    ("compute__big_matmul", "big_matmul.py", dict(mode="infer", batch_size=8192 if CUDA else 512)),
]
# On a CPU run `.cpu()` of a CPU tensor does nothing, so that workload's CPU trace can only show its matmuls.
CPU_FIXTURE_NAMES = {"sync__cpu_per_block": "compute__cpu_sync_per_block"}
SEED_RUNS = [
    ("seed__driving_train", "driving", dict(mode="train")),
    ("seed__resnet50_infer", "resnet50", dict(mode="infer")),
    ("seed__resnet50_train", "resnet50", dict(mode="train")),
    ("seed__mlp_train", "mlp", dict(mode="train")),
]
OPTIONS = CaptureOptions(wait=1, warmup=1, active=2, record_shapes=True, gzip=True)


def fixture_name(name: str) -> str:
    """The fixture's file name on this device: it carries the class a trace recorded here must be named."""
    return name if CUDA else CPU_FIXTURE_NAMES.get(name, name)


def profile_one(rows: Rows, out: Path, name: str, spec: str, changes: dict, expected: Optional[str]) -> None:
    cfg = resolve_config(RunConfig(workload=spec, steps=OPTIONS.steps_needed, trials=1, warmup=3, **changes), None)
    # Sync fixtures keep Python stacks, so the diagnosis can name the line that synced.
    options = replace(OPTIONS, with_stack=True) if name.startswith("sync__") else OPTIONS
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    began = time.time()
    try:
        result, diagnosis, _ = profile_run(spec, cfg, run_dir, options)
    except Exception as err:  # one failing workload must not lose the others' rows
        rows.add(name, "verdict", None, note=f"failed: {type(err).__name__}: {err}"[:200])
        return
    trace = run_dir / options.trace_name
    fixtures = out / "fixtures"
    fixtures.mkdir(exist_ok=True)
    if expected is not None:  # only planted runs become fixtures; their file name carries the expected class
        shutil.copy(trace, fixtures / f"{name}.json.gz")
        shutil.copy(run_dir / "result.json", fixtures / f"{name}.result.json")
    match = "" if expected is None else (" (expected)" if diagnosis.bottleneck == expected else
                                         f" (EXPECTED {expected})")
    rows.add(name, "verdict_confidence", diagnosis.confidence, note=f"{diagnosis.bottleneck}{match}: "
             f"{diagnosis.headline}; levers: {', '.join(diagnosis.levers) or '-'}")
    if expected is not None:
        rows.add(name, "verdict_matches_planted", float(diagnosis.bottleneck == expected))
    rows.add(name, "expected_gain", diagnosis.expected_gain_pct, "%", note="share of the step the verdict explains")
    syncs = diagnosis.profile.syncs
    rows.add(name, "syncs_per_step", syncs.per_step,
             note=", ".join(f"{count:g} {op}" for op, count in syncs.by_op_per_step.items()))
    gpu = diagnosis.profile.gpu
    if gpu:
        rows.add(name, "gpu_busy", gpu.busy_pct, "%")
        rows.add(name, "gpu_idle_charged_to_syncs", gpu.idle_split_pct["host-device syncs"], "%")
    rows.add(name, "trace_size", trace.stat().st_size / 1024, "KiB", note=f"profiled in {time.time() - began:.0f}s")


class MarkersOff(StepHook):
    def start(self, plan) -> None:
        plan.markers = False


def marker_overhead(rows: Rows, spec: str, quick: bool) -> None:
    """Step time with markers on vs off (profiler off), alternating runs; plus the cost of one mark call."""
    steps, pairs = (10, 2) if quick else (30, 3)
    base = dict(workload=spec, mode="train", steps=steps, trials=2, warmup=5)
    if not CUDA:
        base["batch_size"] = 8
    on_ms, off_ms = [], []
    perflab_run(spec, resolve_config(RunConfig(**base), None), command=["bench_diagnose"])  # process warm-up
    for pair in range(pairs):
        order = (((), on_ms), ((MarkersOff(),), off_ms))
        for hooks, bucket in (order if pair % 2 == 0 else order[::-1]):
            cfg = resolve_config(RunConfig(**base), None)
            result = perflab_run(spec, cfg, hooks=hooks, command=["bench_diagnose"])
            bucket.append(result.metrics.latency_ms.p50)
    on, off = min(on_ms), min(off_ms)  # the least disturbed run of each: other load only ever adds time
    rows.add(f"markers_{spec}", "step_ms_markers_on", on, "ms")
    rows.add(f"markers_{spec}", "step_ms_markers_off", off, "ms")
    rows.add(f"markers_{spec}", "overhead_measured", 100 * (on - off) / off, "%",
             note="best p50 step time over alternating runs; within run-to-run noise when tiny")
    per_mark_us = mark_cost_us() - no_mark_cost_us()
    marks_per_step = 6
    rows.add(f"markers_{spec}", "overhead_bound", 100 * marks_per_step * per_mark_us / 1e3 / off, "%",
             note=f"{marks_per_step} marks x {per_mark_us:.2f} us per mark / step time; must be < 1%")


def _loop_cost_us(marker, calls: int = 20000) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        with marker("forward"):
            pass
    return (time.perf_counter() - began) / calls * 1e6


def mark_cost_us() -> float:
    return min(_loop_cost_us(mark) for _ in range(3))


def no_mark_cost_us() -> float:
    return min(_loop_cost_us(no_mark) for _ in range(3))


def run_area(out: Path, quick: bool) -> list[dict]:
    rows = Rows("diagnose", out)
    print(f"[diagnose] device: {'cuda ' + torch.cuda.get_device_name() if CUDA else 'cpu'}", flush=True)
    for name, workload_file, changes in PLANTED_RUNS:
        name = fixture_name(name)
        expected = CLASS_SLUGS[name.split("__")[0]]
        if not CUDA and name.startswith("h2d"):
            expected = None  # no host-to-device copies on a CPU run: recorded, not judged
        profile_one(rows, out, name, str(PLANTED / workload_file), changes, expected)
    seeds = SEED_RUNS if (CUDA or not quick) else SEED_RUNS[-1:]
    for name, spec, changes in seeds:
        if not CUDA:
            changes = {**changes, "batch_size": 4 if spec != "mlp" else 64}
        profile_one(rows, out, name, spec, changes, None)
    for spec in (("resnet50", "driving") if CUDA else ("mlp",)):
        marker_overhead(rows, spec, quick)
    return rows.rows


def run(out: Path, quick: bool) -> list[dict]:
    """The suite protocol: run the area, return its rows."""
    return run_area(out, quick)


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    run_area(args.out, args.quick)
    print(f"[diagnose] done in {time.time() - began:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

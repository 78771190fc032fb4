"""Area "tune": `perflab tune` without a human choosing levers, on the seed workloads.

    BENCH_TUNE_ONLY=resnet50 python -m benchmarks.bench_tune --out DIR      # about 8 minutes on an H100
    BENCH_TUNE_ONLY=driving python -m benchmarks.bench_tune --out DIR       # about 4 minutes
    BENCH_TUNE_ONLY=max-qps python -m benchmarks.bench_tune --out DIR       # about 6 minutes

- resnet50 infer bs256 from fp32 eager (hand-found: 6.1x with bf16 + channels-last + compile; goal >= 8x with
  CUDA graphs / max-autotune), budget 420 s, with --tune-batch (inference: a larger batch changes no optimisation):
  the chain tune is expected to take is bf16, channels-last, compile default, then max-autotune or reduce-overhead
  where the budget left covers their estimated compile time, then the batch;
- driving train bs32 from workers 0 (hand-found: 6.5x with 8 workers + --augment gpu), budget 300 s;
- max-qps: ResNet-50 served from fp32 eager, `--objective max-qps --p99-ms 15 --batcher-max-batch 64` (each measured
  trial a `perflab serve --find-max-qps`, 1 s and 256 queries per point), budget 300 s: the max QPS tune reaches
  against serve's own figure for bf16 + channels-last + compile (BENCHMARKS.md, issue 10).
The planted workloads are area "tune_planted" (benchmarks/bench_tune_planted.py), which reuses `tune_rows`.

Rows: start and tuned throughput, the speed-up, the kept levers, the time tune took (its trials' wall time,
and of that the warm-up/compile time), why it stopped; one row per trial with its measured gain and, in the
note, the predicted gain and the decision; one row per lever not tried, with why (a compile mode whose
estimated compile time did not fit the budget left, a lever that would replace a kept one). Each tune
directory (trials, tune.json, report.html) is under --out. A budget is spent by whole trials: the last trial
may run past it (a compile trial is stopped at it), so an experiment takes its budget plus about one trial.
Run the two experiments in separate device calls (BENCH_TUNE_ONLY); without CUDA (or with --quick) everything
shrinks to a smoke run.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.serve import ServeConfig
from perflab.tune import TuneConfig, tune
from perflab.tune.output import objective_figure

TIMING = dict(steps=15, trials=3, warmup=3, quality_steps=3)
SMOKE_TIMING = dict(steps=4, trials=3, warmup=2, quality_steps=2)


def experiments(cuda: bool, quick: bool) -> list[tuple[str, RunConfig, TuneConfig]]:
    """(name, starting point, tune settings) per experiment, sized for the device."""
    full = cuda and not quick
    timing = TIMING if full else SMOKE_TIMING
    small = {} if full else {"image_res": "32"}
    return [
        ("resnet50 infer bs256 from fp32 eager",
         RunConfig(workload="resnet50", mode="infer", batch_size=256 if full else 2, workload_options=small,
                   **timing), TuneConfig(budget="420s" if full else "40s", tune_batch=True)),
        ("driving train bs32 from workers 0",
         RunConfig(workload="driving", mode="train", batch_size=32 if full else 2, workers=0,
                   workload_options=small, **{**timing, "steps": 10 if full else 4}),
         TuneConfig(budget="300s" if full else "40s")),
        ("max-qps ResNet-50 serve p99 15ms from fp32 eager",  # no "resnet50" in the name: BENCH_TUNE_ONLY
         RunConfig(workload="resnet50", mode="infer", workload_options=small, warmup=timing["warmup"],
                   quality_steps=timing["quality_steps"]),
         TuneConfig(budget="300s" if full else "40s", objective="max-qps",
                    serve=ServeConfig(p99_ms=15.0 if full else 500.0, max_batch=64 if full else 2,
                                      duration_s=1.0 if full else 0.2, min_queries=256 if full else 8))),
    ]


def record(rows: Rows, name: str, summary: dict[str, Any], took_s: float) -> None:
    """The tune's outcome, then predicted against measured gain for each trial."""
    start, best = summary["start"] or {}, summary["best"] or {}
    kept = ", ".join(summary["kept"]) or "nothing"
    key, unit = objective_figure((summary.get("objective") or {}).get("name", "throughput"))
    figure = "max QPS" if key == "max_qps" else "throughput"
    rows.add(name, f"start {figure}", start.get(key), unit)
    rows.add(name, f"tuned {figure}", best.get(key), unit, f"kept: {kept}; quality "
             f"{best.get('quality') or 'not checked'}")
    rows.add(name, "speed-up", summary.get("speedup"), "x", f"recipe: {summary['recipe']['command']}")
    rows.add(name, "tune time", round(took_s, 1), "s", f"{summary['trials']} trials, {summary['spent_s']:.0f} s "
             f"charged to a {summary.get('budget_s') or 0:.0f} s budget ({summary['compile_and_warmup_s']:.0f} s "
             f"warm-up/compile, {summary.get('compile_s') or 0:.0f} s compiling); stopped: {summary['stop_reason']}")
    for link in summary["chain"]:
        predicted = link.get("predicted_gain_pct")
        rows.add(name, f"trial {link['label']}", link.get("measured_gain_pct"), "% gain",
                 f"predicted {'n/a' if predicted is None else f'{predicted:+.0f}%'}; bottleneck "
                 f"{link.get('bottleneck')}; {'kept' if link['kept'] else 'rejected'}: {link.get('why')}; "
                 f"{link.get('wall_s') or 0:.0f} s (compile {link.get('compile_s') or 0:.0f} s)")
    for entry in summary.get("screened") or []:  # the first stage: one short trial each
        rows.add(name, f"screened {entry['label']}", entry.get("screened_gain_pct"), "% gain",
                 f"{entry['outcome']}; {entry.get('wall_s') or 0:.0f} s (compile {entry.get('compile_s') or 0:.0f} s)")
    for label, why in (summary.get("skipped") or {}).items():
        rows.add(name, f"not tried {label}", None, "", why)


def tune_rows(area: str, out: Path, experiments: list[tuple[str, RunConfig, TuneConfig]]) -> list[dict]:
    """Tune each experiment into its own folder under `out` and record its rows."""
    rows = Rows(area, out)
    for name, start, settings in experiments:
        folder = out / name.replace(" ", "-")
        began = time.perf_counter()
        try:
            summary = tune(start, settings, folder, command=["benchmarks", area, name])
        except Exception as err:  # one failing experiment must not cost the others
            traceback.print_exc()
            rows.add(name, "error", None, "", f"{type(err).__name__}: {err}")
            continue
        record(rows, name, summary, time.perf_counter() - began)
    return rows.rows


def run(out: Path, quick: bool, only: str = "") -> list[dict]:
    """Every experiment, or those whose name contains `only` (BENCH_TUNE_ONLY=resnet50 for one)."""
    chosen = [e for e in experiments(torch.cuda.is_available(), quick) if only in e[0]]
    return tune_rows("tune", out, chosen)


if __name__ == "__main__":
    args = parse_args()
    run(args.out, args.quick, os.environ.get("BENCH_TUNE_ONLY", ""))

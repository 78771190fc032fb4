"""Area "tune_planted": `perflab tune` on the planted workloads of tests/planted, one known bottleneck each.

    python -m benchmarks.bench_tune_planted --out DIR [--quick]

Per workload: the lever tune kept (if any) and its gain, and for every trial the predicted gain (from the
diagnosis's expected_gain_pct) against the measured one. The sync workloads have no lever that removes a
sync (the fix is in the user's code), so tune is expected to keep nothing there and say why. A short budget
each (45 s: start, profile, the first levers): the area takes about 8 minutes on an H100 (at 15 s,
only the start was measured).
"""
from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.bench_tune import SMOKE_TIMING, TIMING, tune_rows
from benchmarks.common import parse_args
from perflab.config import RunConfig
from perflab.tune import TuneConfig

PLANTED = Path(__file__).resolve().parents[1] / "tests" / "planted"
# (file, workload options, run options): the settings each planted file documents for its bottleneck.
WORKLOADS = [
    ("slow_loader", {"item_ms": "2"}, {}),
    ("pageable_inputs", {}, {"pin_memory": False}),
    ("tiny_ops", {}, {"batch_size": 1}),
    ("elementwise_chain", {}, {}),
    ("big_matmul", {}, {}),
    ("nonzero_router", {}, {}),
]


def experiments(cuda: bool, quick: bool) -> list[tuple[str, RunConfig, TuneConfig]]:
    full = cuda and not quick
    # 1-s trials: these steps take milliseconds, and a trial's process start already costs seconds
    timing = {**TIMING, "min_trial_s": 1.0} if full else SMOKE_TIMING
    return [(f"planted {name}", RunConfig(workload=f"{PLANTED / name}.py:build", mode="train",
                                          workload_options=options, **{**timing, **extra}),
             TuneConfig(budget="45s" if full else "20s"))
            for name, options, extra in WORKLOADS]


def run(out: Path, quick: bool) -> list[dict]:
    return tune_rows("tune_planted", out, experiments(torch.cuda.is_available(), quick))


if __name__ == "__main__":
    args = parse_args()
    run(args.out, args.quick)

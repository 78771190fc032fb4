"""Why do loader-fed trials disagree? Each case run under variants, printing every trial's figures.

    STEADY_PROBE_ONLY=augment python -m benchmarks.steady_probe --out DIR [--quick]

Variants: as perflab runs it; with Python's garbage collector off for the whole run (as timeit does); with
trials of at least 10 s. Per trial: throughput, the phases' mean per step, and p50/p90 step time. A last table gives the spread (range/median) per case and variant.
"""
from __future__ import annotations

import gc
import json
import os
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

import perflab
from benchmarks.bench_steady import cases
from benchmarks.common import parse_args


@contextmanager
def garbage_collector(enabled: bool) -> Iterator[None]:
    gc.collect()
    if not enabled:
        gc.disable()
    try:
        yield
    finally:
        gc.enable()


VARIANTS = [("as is", True, {}), ("gc off", False, {}), ("10 s trials", True, {"min_trial_s": 10.0})]


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.quick
    summary = []
    only = os.environ.get("STEADY_PROBE_ONLY", "")
    for name, workload, settings in [case for case in cases(cuda) if only in case[0]]:
        for variant, gc_on, extra in VARIANTS:
            cfg = perflab.RunConfig(workload=workload, out=str(args.out / f"{name}-{variant}".replace(" ", "-")),
                                    **{**settings, **extra})
            with garbage_collector(gc_on):
                result = perflab.run(workload, cfg, command=["benchmarks", "steady_probe", name, variant])
            print(f"== {name} · {variant}")
            for index, trial in enumerate(result.trials):
                steps = np.asarray(trial.step_ms)
                print(f"  trial {index}: {trial.throughput_samples_per_s:8.1f} samples/s  {trial.steps} steps  "
                      f"step p50 {np.median(steps):6.1f} p90 {np.percentile(steps, 90):6.1f} ms  phases "
                      f"{json.dumps({k: round(v, 1) for k, v in trial.phase_ms.items()})}", flush=True)
            summary.append((name, variant, result.metrics.throughput_samples_per_s.range_pct,
                            result.metrics.throughput))
    print("\ncase | variant | spread % | median samples/s")
    for name, variant, spread, median in summary:
        print(f"{name} | {variant} | {spread:.1f} | {median:.1f}")


if __name__ == "__main__":
    main()

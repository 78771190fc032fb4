"""Area "steady": are loader-bound runs steady enough to decide on? Throughput spread between trials.

    python -m benchmarks.bench_steady --out DIR [--quick]

The settings where BENCHMARKS.md measured large spreads before the harness drained the DataLoader's
prefilled queue and sized loader-fed trials by time: driving train bs32 with 8 workers (45%), augment
train with per-sample CPU augmentation in 8 workers, and augment with gpu-stream + bf16 + channels-last
(32-72%). Each runs 5 trials; rows give the median throughput, the range between trials (the goal is 5%
or less), the steps each trial took and the untimed steps that used up the loader's queue.
"""
from __future__ import annotations

import torch

import perflab
from benchmarks.common import Rows, parse_args
from perflab.results.metrics import Interference, SteadyState


def cases(cuda: bool) -> list[tuple[str, str, dict]]:
    if not cuda:
        return [("driving train bs4 2 workers", "driving",
                 {"batch_size": 4, "workers": 2, "steps": 8, "trials": 3, "warmup": 2, "min_trial_s": 0.5,
                  "workload_options": {"image_res": "32"}})]
    five = {"trials": 5, "warmup": 3}
    return [
        ("driving train bs32 8 workers", "driving", {"batch_size": 32, "workers": 8, "steps": 16, **five}),
        ("augment train bs32 cpu 8 workers", "augment", {"batch_size": 32, "workers": 8, "augment": "cpu",
                                                          "steps": 40, **five}),
        ("augment train bs32 gpu-stream+bf16+cl", "augment",
         {"batch_size": 32, "augment": "gpu-stream", "precision": "bf16", "channels_last": True, "steps": 40,
          "check_quality": False, **five}),
        ("augment train bs128 gpu-stream+bf16+cl", "augment",
         {"batch_size": 128, "augment": "gpu-stream", "precision": "bf16", "channels_last": True, "steps": 40,
          "check_quality": False, **five}),
    ]


def main() -> None:
    args = parse_args()
    rows = Rows("steady", args.out)
    cuda = torch.cuda.is_available() and not args.quick
    for name, workload, settings in cases(cuda):
        run_dir = args.out / name.replace(" ", "-").replace("+", "-")
        result = perflab.run(workload, perflab.RunConfig(workload=workload, out=str(run_dir), **settings),
                             command=["benchmarks", "steady", name])
        run_dir.mkdir(parents=True, exist_ok=True)
        result.save(run_dir)
        tp = result.metrics.throughput_samples_per_s
        steady = result.metrics.steady_state or SteadyState()
        rows.add(name, "throughput", tp.median, "samples/s",
                 f"trials {[round(t.throughput_samples_per_s) for t in result.trials]}")
        rows.add(name, "spread (range/median)", tp.range_pct, "%", "goal <= 5%")
        rows.add(name, "steps per trial", result.trials[0].steps, "", f"--steps {settings['steps']}")
        rows.add(name, "untimed steps to drain the loader", steady.steps, "",
                 f"settled={steady.settled} windows ms/step {steady.window_step_ms}")
        interference = result.metrics.interference or Interference()
        rows.add(name, "machine busy", float(interference.busy), "",
                 f"other CPU cores max {interference.other_cpu_cores_max}")


if __name__ == "__main__":
    main()

"""Area "levers": the seed experiments, each baseline and candidate measured in one perflab.run each.

    python -m benchmarks.bench_levers --out DIR [--quick]

- resnet50 infer bs256 and train bs128: fp32 eager vs bf16 + channels-last + torch.compile (seed 001);
- augment bs32/bs128: per-sample CPU augmentation in 8 workers vs batched GPU augmentation vs the same
  on a side stream (seed 004 part 2);
- segmentation bs8/bs32: serial vs --pipeline streams (seed 004 part 1);
- driving bs32: each data-path lever: workers 0/4/8, pinned memory on/off, the stream prefetcher,
  device-side preprocessing (seed 000).

Rows: throughput median (with spread, 95% CI and the quality verdict in the note) and the speed-up over
the experiment's baseline; each run's result.json is saved under --out. Without CUDA (or with --quick)
sizes and steps shrink so the area finishes in about a minute; CUDA-only variants are listed as skipped.
"""
from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

import perflab
from benchmarks.common import Rows, parse_args
from perflab.levers import active_levers
from perflab.results.metrics import Throughput

CPU_WORKERS = 2  # the CPU machine the quick run is checked on has two cores


@dataclass
class Experiment:
    """One seed experiment: shared settings, then (label, changes) variants; the first is the baseline."""

    name: str
    workload: str
    settings: dict[str, Any]
    variants: list[tuple[str, dict[str, Any]]]
    notes: dict[str, str] = field(default_factory=dict)  # label -> what to expect / why


def experiments(cuda: bool, quick: bool) -> list[Experiment]:
    """The seed experiments, sized for the device: full on a GPU, tiny on CPU or with --quick."""
    full = cuda and not quick
    timing = {"steps": 20, "trials": 3, "warmup": 3} if full else {"steps": 2, "trials": 2, "warmup": 2}
    # Compilation happens in warm-up; the quality gate compiles its own copy too, so keep its steps short.
    gate = {"quality_steps": 3 if full else 2}
    best = {"precision": "bf16", "channels_last": True, **({"compile": "default"} if cuda else {})}
    small = {} if cuda else {"image_res": "32"}
    out = [
        Experiment("resnet50 infer", "resnet50", {"mode": "infer", "batch_size": 256 if full else 2,
                                                  "workload_options": small, **timing, **gate},
                   [("fp32 eager", {}), ("bf16+channels-last" + ("+compile" if cuda else ""), best)],
                   {"fp32 eager": "strict fp32 (TF32 off)"}),
        Experiment("resnet50 train", "resnet50", {"mode": "train", "batch_size": 128 if full else 2,
                                                  "workload_options": small, **timing, **gate},
                   [("fp32 eager", {}), ("bf16+channels-last" + ("+compile" if cuda else ""), best)]),
    ]
    augment_opts = {} if cuda else {"image_size": "32", "max_width": "256"}
    # Longer trials: the CPU pipeline's throughput depends on how many batches its workers have queued.
    augment_timing = {**timing, "steps": 40} if full else timing
    for batch in ([32, 128] if full else [8]):
        variants = [(f"cpu {8 if cuda else CPU_WORKERS} workers",
                     {"augment": "cpu", "workers": 8 if cuda else CPU_WORKERS}),
                    ("gpu", {"augment": "gpu"}),
                    ("gpu-stream", {"augment": "gpu-stream"})]
        if cuda:  # once augmentation leaves the host, the model step is the ceiling: lower precision lifts it
            variants.append(("gpu-stream+bf16+channels-last",
                             {"augment": "gpu-stream", "precision": "bf16", "channels_last": True, **gate}))
        out.append(Experiment(f"augment train bs{batch}", "augment",
                              {"batch_size": batch, "workload_options": augment_opts, **augment_timing},
                              variants, {"gpu-stream": "augmentation of batch N+1 on a side stream"}))
    segmentation_opts = {} if cuda else {"image_size": "32", "width": "8"}
    for batch in ([8, 32] if full else [4]):
        out.append(Experiment(f"segmentation train bs{batch}", "segmentation",
                              {"batch_size": batch, "workers": 4 if cuda else 0,
                               "workload_options": segmentation_opts, **timing},
                              [("serial", {}), ("pipeline streams", {"pipeline": "streams"})]))
    driving_timing = {"steps": 16, "trials": 3, "warmup": 3} if full else timing
    many = 8 if cuda else CPU_WORKERS
    out.append(Experiment(f"driving train bs{32 if full else 2}", "driving",
                          {"batch_size": 32 if full else 2, "workload_options": small, **driving_timing},
                          [("workers 0", {"workers": 0}),
                           ("workers 4", {"workers": 4}),
                           (f"workers {many}", {"workers": many}),
                           ("workers 8, no pin-memory", {"workers": 8, "pin_memory": False}),
                           ("workers 8 + prefetcher stream", {"workers": 8, "prefetcher": "stream"}),
                           (f"workers {many} + augment gpu", {"workers": many, "augment": "gpu"})],
                          {f"workers {many} + augment gpu": "JPEG decode only on the host; convert/resize/"
                                                            "normalise batched on the device"}))
    return out


def skip_reason(changes: dict[str, Any], cuda: bool) -> Optional[str]:
    """Why a variant does not run here (CUDA-only levers, more workers than a small CPU box has), or None."""
    if cuda:
        return None
    cfg = perflab.RunConfig(**{key: value for key, value in changes.items() if key != "workload_options"})
    if any(lever.needs_cuda for lever in active_levers(cfg)) or cfg.pin_memory is False:
        return "skipped: needs CUDA"  # the levers say; --no-pin-memory only means something on CUDA
    if changes.get("workers", 0) > CPU_WORKERS:
        return f"skipped: more workers than the {CPU_WORKERS} used on CPU"
    return None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def quality_text(result: perflab.Result) -> str:
    if result.quality is None:
        return "quality: not run (no lever changes numerics)"
    return f"quality: {result.quality.verdict} ({result.quality.reason})"


def run_variant(rows: Rows, out: Path, experiment: Experiment, label: str, changes: dict[str, Any],
                baseline: Optional[Throughput]) -> Optional[Throughput]:
    """Measure one variant, save its result.json, add its rows; returns its throughput summary."""
    name = experiment.name
    run_dir = out / slug(f"{name} {label}")
    cfg = perflab.RunConfig(workload=experiment.workload, out=str(run_dir), **{**experiment.settings, **changes})
    began = time.perf_counter()
    try:
        result = perflab.run(experiment.workload, cfg, command=["benchmarks", name, label])
    except Exception as err:  # a failed variant is a finding; the area goes on
        traceback.print_exc()
        rows.add(name, f"{label} throughput", None, "samples/s", f"failed: {type(err).__name__}: {err}"[:300])
        return None
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    run_dir.mkdir(parents=True, exist_ok=True)
    result.save(run_dir)
    tp = result.metrics.throughput_samples_per_s
    shares = result.metrics.phase_share_pct
    top = max(shares, key=shares.get) if shares else "?"
    compile_s = result.metrics.compile_s
    peak_mb = result.peak_memory.mb if result.peak_memory.on_gpu else None
    note = (f"spread {tp.range_pct:.1f}% · CI95 {tp.ci95_low:.0f}–{tp.ci95_high:.0f} · "
            f"p95 {result.metrics.latency_ms.p95:.2f} ms · top phase {top} {shares.get(top, 0):.0f}% · "
            + (f"peak {peak_mb:.0f} MiB · " if peak_mb is not None else "")
            + f"{quality_text(result)} · {time.perf_counter() - began:.0f}s wall"
            + (f" · compile {compile_s:.0f}s" if compile_s else ""))
    if label in experiment.notes:
        note += f" · {experiment.notes[label]}"
    rows.add(name, f"{label} throughput", tp.median, "samples/s", note)
    if baseline is not None:
        overlap = tp.ci95_low <= baseline.ci95_high and baseline.ci95_low <= tp.ci95_high
        rows.add(name, f"{label} speed-up", tp.median / baseline.median, "x",
                 f"vs {experiment.variants[0][0]}" + (" · CIs overlap: no significant change" if overlap else ""))
    return tp


def run(out: Path, quick: bool) -> list[dict]:
    """Every seed experiment in order; returns the rows (also written to out/rows.json as they come)."""
    return run_experiments("levers", out, experiments(torch.cuda.is_available(), quick))


def run_experiments(area: str, out: Path, plan: list[Experiment]) -> list[dict]:
    """Each experiment's variants in order, the first as baseline; rows written to out/rows.json as they come."""
    out.mkdir(parents=True, exist_ok=True)
    rows = Rows(area, out)
    cuda = torch.cuda.is_available()
    began = time.perf_counter()
    for experiment in plan:
        baseline = None
        for index, (label, changes) in enumerate(experiment.variants):
            reason = skip_reason(changes, cuda)
            if reason:
                rows.add(experiment.name, f"{label} throughput", None, "samples/s", reason)
                continue
            print(f"[{area}] {experiment.name} · {label} (t={time.perf_counter() - began:.0f}s)", flush=True)
            summary = run_variant(rows, out, experiment, label, changes, baseline)
            if index == 0:
                baseline = summary
    print(f"[{area}] done in {time.perf_counter() - began:.0f}s", flush=True)
    return rows.rows


def main() -> None:
    args = parse_args()
    run(args.out, args.quick)


if __name__ == "__main__":
    main()

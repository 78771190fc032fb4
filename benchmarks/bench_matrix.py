"""Area "matrix": one lever at a time, then combined, on the same step (the answer to "which lever helps,
by how much?").

- resnet50 infer bs256 and train bs128: fp32, tf32, bf16, fp16, channels-last, bf16 + channels-last,
  + compile (default and reduce-overhead), CUDA graphs;
- transformer train (seq 1024 and 4096): SDPA math vs flash vs efficient in bf16, and activation
  checkpointing's memory saving and its cost in time.
Every variant is a full perflab.run (quality gate included where a lever changes numerics).
"""
from __future__ import annotations

from typing import Any

import torch

import perflab
from benchmarks.common import Rows, parse_args


def measure(rows: Rows, out, experiment: str, label: str, workload: str, settings: dict[str, Any],
            baseline: float | None) -> float | None:
    cfg = perflab.RunConfig(workload=workload, **settings)
    try:
        result = perflab.run(workload, cfg, command=["bench_matrix"])
    except Exception as err:  # one variant failing must not lose the others
        rows.add(experiment, f"{label} throughput", None, note=f"failed: {type(err).__name__}: {err}"[:200])
        return None
    result.save(_dir(out, experiment, label))
    metrics = result.metrics
    throughput = metrics["throughput_samples_per_s"]
    memory = metrics["memory"].get("peak_allocated_mb")
    quality = result.quality["verdict"] if result.quality else "not run"
    speedup = f" · {throughput['median'] / baseline:.2f}x" if baseline else ""
    compile_s = metrics.get("compile_s")
    note = [f"spread {throughput['range_pct']:.1f}%{speedup}", f"p95 {metrics['latency_ms']['p95']:.2f} ms"]
    if memory is not None:
        note.append(f"peak {memory:.0f} MiB")
    note.append(f"quality {quality}")
    if compile_s:
        note.append(f"compile/capture {compile_s:.0f}s")
    rows.add(experiment, f"{label} throughput", throughput["median"], "samples/s", " · ".join(note))
    return throughput["median"]


def _dir(out, experiment: str, label: str):
    name = "".join(c if c.isalnum() else "-" for c in f"{experiment}-{label}").strip("-")
    path = out / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> None:
    args = parse_args()
    rows = Rows("matrix", args.out)
    cuda = torch.cuda.is_available()
    full = cuda and not args.quick
    timing = {"steps": 20, "trials": 3, "warmup": 5, "quality_steps": 4} if full else \
        {"steps": 2, "trials": 1, "warmup": 2, "quality_steps": 2}
    small = {} if cuda else {"workload_options": {"image_res": "32"}}
    variants = [("fp32", {}), ("tf32", {"precision": "tf32"}), ("bf16", {"precision": "bf16"}),
                ("fp16", {"precision": "fp16"}), ("channels-last", {"channels_last": True}),
                ("bf16+channels-last", {"precision": "bf16", "channels_last": True}),
                ("bf16+channels-last+compile", {"precision": "bf16", "channels_last": True, "compile": "default"}),
                ("bf16+channels-last+compile reduce-overhead",
                 {"precision": "bf16", "channels_last": True, "compile": "reduce-overhead"}),
                ("bf16+channels-last+cuda-graphs", {"precision": "bf16", "channels_last": True, "cuda_graphs": True})]
    if not cuda:
        variants = [(label, v) for label, v in variants
                    if v.get("precision") not in ("tf32", "fp16") and not v.get("cuda_graphs") and not v.get("compile")]
    for mode, batch in (("infer", 256 if full else 2), ("train", 128 if full else 2)):
        experiment = f"resnet50 {mode} bs{batch}"
        baseline = None
        for label, changes in variants:
            value = measure(rows, args.out, experiment, label, "resnet50",
                            {"mode": mode, "batch_size": batch, **timing, **small, **changes}, baseline)
            baseline = baseline or value
    seq_lens = (1024, 4096) if full else (64,)
    for seq_len in seq_lens:
        experiment = f"transformer train seq{seq_len}"
        options = {"workload_options": {"seq_len": str(seq_len)}}
        batch = {"batch_size": 16 if seq_len <= 1024 else 4} if full else {"batch_size": 2}
        baseline = None
        attention = [("bf16 sdpa math", {"precision": "bf16", "sdpa": "math"}),
                     ("bf16 sdpa flash", {"precision": "bf16", "sdpa": "flash"}),
                     ("bf16 sdpa efficient", {"precision": "bf16", "sdpa": "efficient"}),
                     ("bf16 sdpa flash + activation checkpointing",
                      {"precision": "bf16", "sdpa": "flash", "activation_checkpointing": True})]
        if not cuda:
            attention = [("bf16 sdpa math", {"precision": "bf16", "sdpa": "math"}),
                         ("bf16 + activation checkpointing", {"precision": "bf16", "activation_checkpointing": True})]
        for label, changes in attention:
            value = measure(rows, args.out, experiment, label, "transformer",
                            {"mode": "train", **timing, **options, **batch, **changes}, baseline)
            baseline = baseline or value


if __name__ == "__main__":
    main()

"""Area "matrix": one lever at a time, then combined, on the same step (the answer to "which lever helps,
by how much?").

    python -m benchmarks.bench_matrix --out DIR [--quick]

- resnet50 infer bs256 and train bs128: fp32, tf32, bf16, fp16, channels-last, bf16 + channels-last,
  + compile (default and reduce-overhead), CUDA graphs;
- transformer train (seq 1024 and 4096): SDPA math vs flash vs efficient in bf16, and activation
  checkpointing's memory saving and its cost in time.
Every variant is a full perflab.run (quality gate included where a lever changes numerics); the rows and
saved results follow benchmarks/bench_levers.py.
"""
from __future__ import annotations

import torch

from benchmarks.bench_levers import Experiment, run_experiments
from benchmarks.common import parse_args
from perflab.config import RunConfig
from perflab.levers import active_levers

BF16_CL = {"precision": "bf16", "channels_last": True}
RESNET50_VARIANTS = [
    ("fp32", {}), ("tf32", {"precision": "tf32"}), ("bf16", {"precision": "bf16"}), ("fp16", {"precision": "fp16"}),
    ("channels-last", {"channels_last": True}), ("bf16+channels-last", BF16_CL),
    ("bf16+channels-last+compile", {**BF16_CL, "compile": "default"}),
    ("bf16+channels-last+compile reduce-overhead", {**BF16_CL, "compile": "reduce-overhead"}),
    ("bf16+channels-last+cuda-graphs", {**BF16_CL, "cuda_graphs": True}),
]
ATTENTION_VARIANTS = [
    ("bf16 sdpa math", {"precision": "bf16", "sdpa": "math"}),
    ("bf16 sdpa flash", {"precision": "bf16", "sdpa": "flash"}),
    ("bf16 sdpa efficient", {"precision": "bf16", "sdpa": "efficient"}),
    ("bf16 sdpa flash + activation checkpointing",
     {"precision": "bf16", "sdpa": "flash", "activation_checkpointing": True}),
]


def runs_on_cpu(changes: dict) -> bool:
    """No lever of the variant needs CUDA (the levers say), and nothing compiles: compiling on a small CPU
    takes minutes, so the CPU pass checks the harness, not Inductor."""
    cfg = RunConfig(**changes)
    return not any(lever.needs_cuda for lever in active_levers(cfg)) and not cfg.compile


def experiments(cuda: bool, quick: bool) -> list[Experiment]:
    full = cuda and not quick
    timing = {"steps": 20, "trials": 3, "warmup": 5, "quality_steps": 4} if full else \
        {"steps": 2, "trials": 1, "warmup": 2, "quality_steps": 2}
    resnet = RESNET50_VARIANTS if cuda else [v for v in RESNET50_VARIANTS if runs_on_cpu(v[1])]
    attention = ATTENTION_VARIANTS if cuda else [
        ("bf16 sdpa math", {"precision": "bf16", "sdpa": "math"}),
        ("bf16 + activation checkpointing", {"precision": "bf16", "activation_checkpointing": True})]
    small = {} if cuda else {"image_res": "32"}
    out = [Experiment(f"resnet50 {mode} bs{batch}", "resnet50",
                      {"mode": mode, "batch_size": batch, "workload_options": small, **timing}, resnet)
           for mode, batch in (("infer", 256 if full else 2), ("train", 128 if full else 2))]
    for seq_len in ((1024, 4096) if full else (64,)):
        batch = (16 if seq_len <= 1024 else 4) if full else 2
        out.append(Experiment(f"transformer train seq{seq_len}", "transformer",
                              {"mode": "train", "batch_size": batch, "workload_options": {"seq_len": str(seq_len)},
                               **timing}, attention))
    return out


def main() -> None:
    args = parse_args()
    run_experiments("matrix", args.out, experiments(torch.cuda.is_available(), args.quick))


if __name__ == "__main__":
    main()

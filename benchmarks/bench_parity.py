"""Area "parity": the same runs through two perflab trees, interleaved, to show a refactor changed no figure.

    python -m benchmarks.bench_parity --out DIR [--old PATH] [--quick]

PATH holds an earlier perflab tree (default: .parity/old, made with `git worktree add .parity/old <commit>`
and carried to the device). Each round runs, for the old tree then the new one, `perflab run` as its own
process (PYTHONPATH pointing at that tree):
- resnet50 infer bf16, batch 256, synthetic data on the device;
- driving train at batch 32 on batches staged on the device (the model step and the harness, no loader);
- driving train with its defaults (fp32, loader workers): bound by the host's JPEG decoding, which swings 20-45%
  between windows on the lent VM (BENCHMARKS.md, loader_drift), so it shows the spread rather than a 1% answer.
Harness overhead: perflab's resnet50 throughput against a bare hand-written loop over the same model, precision
and pre-staged batches in this process, measured once per round between the two trees.
Rows: each tree's median over rounds, and new/old - 1 in percent.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchvision.models import resnet50

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import Rows  # noqa: E402

RUNS = {
    "resnet50 infer bf16 b256": ["--workload", "resnet50", "--mode", "infer", "--precision", "bf16", "--batch", "256",
                                 "--data", "device", "--steps", "40", "--trials", "5", "--warmup", "10"],
    "driving train b32 device data": ["--workload", "driving", "--mode", "train", "--batch", "32", "--data", "device",
                                      "--steps", "30", "--trials", "5", "--warmup", "5"],
    "driving train (loader)": ["--workload", "driving", "--mode", "train"],
}
QUICK = {
    "mlp infer": ["--workload", "mlp", "--mode", "infer", "--steps", "20", "--trials", "3", "--warmup", "3"],
    "mlp train": ["--workload", "mlp", "--mode", "train", "--steps", "20", "--trials", "3", "--warmup", "3"],
}


def perflab_run(tree: Path, argv: list[str], device: str) -> dict:
    """One `perflab run` of `tree` in its own process; the throughput median and spread from its result.json."""
    with tempfile.TemporaryDirectory(prefix="parity-") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-m", "perflab", "run", *argv, "--device", device, "--out", out],
                              env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"perflab run in {tree} failed: {done.stderr[-2000:]}")
        data = json.loads((Path(out) / "result.json").read_text())
    throughput = data["metrics"]["throughput_samples_per_s"]
    return {"median": throughput["median"], "range_pct": throughput.get("range_pct"),
            "schema": data["schema_version"]}


def bare_resnet50_bf16(batch: int, steps: int, trials: int, warmup: int, device: torch.device) -> float:
    """The simplest honest loop: same model in eval, bf16 autocast, 4 distinct device batches, sync at the ends."""
    torch.manual_seed(0)
    model = resnet50(weights=None).to(device).eval()
    batches = [torch.randn(batch, 3, 224, 224, device=device) for _ in range(4)]
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
        for i in range(warmup):
            model(batches[i % 4])
        _sync(device)
        throughputs = []
        for _ in range(trials):
            _sync(device)
            began = time.perf_counter()
            for i in range(steps):
                model(batches[i % 4])
            _sync(device)
            throughputs.append(steps * batch / (time.perf_counter() - began))
    del model, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(throughputs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--old", type=Path, default=ROOT / ".parity" / "old")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = Rows("parity", args.out)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    runs = QUICK if args.quick or not cuda else RUNS
    trees = {"old": args.old.resolve(), "new": ROOT}
    medians: dict[tuple[str, str], list[float]] = {}
    bare: list[float] = []
    for round_ in range(args.rounds):
        for name, argv in runs.items():
            for tree_name, tree in trees.items():
                measured = perflab_run(tree, argv, device)
                medians.setdefault((name, tree_name), []).append(measured["median"])
                print(f"[parity] round {round_ + 1} {name} {tree_name}: {measured['median']:.1f}/s "
                      f"(spread {measured['range_pct']:.1f}%, schema {measured['schema']})", flush=True)
        if cuda:
            bare.append(bare_resnet50_bf16(256, 40, 5, 10, torch.device("cuda")))
            print(f"[parity] round {round_ + 1} bare resnet50 bf16: {bare[-1]:.1f}/s", flush=True)
    for name in runs:
        old, new = (statistics.median(medians[(name, tree)]) for tree in ("old", "new"))
        rows.add(name, "old samples/s", old, "samples/s", f"rounds {medians[(name, 'old')]}")
        rows.add(name, "new samples/s", new, "samples/s", f"rounds {medians[(name, 'new')]}")
        rows.add(name, "new vs old", 100 * (new / old - 1), "%")
        if bare and name.startswith("resnet50"):
            floor = statistics.median(bare)
            rows.add(name, "bare loop samples/s", floor, "samples/s", f"rounds {bare}")
            rows.add(name, "old overhead vs bare", 100 * (1 - old / floor), "%")
            rows.add(name, "new overhead vs bare", 100 * (1 - new / floor), "%")


if __name__ == "__main__":
    main()

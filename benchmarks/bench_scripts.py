"""Area "scripts": users' own training scripts profiled unchanged (issue 15).

    python -m benchmarks.bench_scripts --out DIR [--quick]
    BENCH_SCRIPTS_ONLY=gpt python -m benchmarks.bench_scripts --out DIR   # studies whose name has it

For a plain ResNet-50 training script and a plain transformers-style (GPT) training script in
benchmarks/scripts/, each in its own process:
- the script alone (it prints its own steps/s, device synchronised at both ends);
- `perflab run -- python SCRIPT ...` (steps, phases, NVML; no trace) and `perflab profile -- ...` (trace and diagnosis);
- `perflab run` on the equivalent workload: the built-in resnet50, and gpt_train.py's own `build` as a plugin,
  same batch and precision. The script under perflab should be within 5% of it, and of the script alone.
- perflab's overhead on the script: the script's own figure (it prints it under perflab too) under `perflab run --`
  against the script alone, the same clock on both sides.
The GPT script is launch-bound, so it moves with the host's speed: it runs 200 steps, in three interleaved rounds
(alone, under perflab, the plugin, then again), and the medians are compared.
A third script run feeds ResNet-50 from a DataLoader with a few workers, to show a GPU diagnosis of a script's
input pipeline. DIR/<name>/ holds each run's result.json (and trace.json.gz, diagnosis.json when profiled).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from benchmarks.bench_levers import slug
from benchmarks.common import Rows, parse_args
from perflab.results.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "benchmarks" / "scripts"
WARMUP = 5
PROCESS_TIMEOUT_S = 150
PROFILE = ["--wait", "1", "--warmup-steps", "1", "--active", "3", "--gzip-trace"]


def _run(command: list[str]) -> tuple[Optional[subprocess.CompletedProcess], float]:
    began = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, time.time() - began
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", flush=True)
    return done, time.time() - began


def _failed(rows: Rows, experiment: str, done: Optional[subprocess.CompletedProcess], elapsed_s: float) -> bool:
    if done is not None and done.returncode == 0:
        return False
    why = f"timeout after {elapsed_s:.0f}s" if done is None else f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    rows.add(experiment, "samples_per_s", None, note=f"failed: {why}")
    return True


def own_report(stdout: str) -> Optional[dict]:
    """The script's own JSON line ({"script": ..., "samples_per_s": ...}) in its output, alone or under perflab."""
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"script"'):
            return json.loads(line)
    return None


def script_alone(rows: Rows, name: str, script: str, args: list[str], batch: int) -> Optional[float]:
    """The script by itself, as its user runs it: its own samples/s."""
    experiment = f"{name}: script alone"
    done, elapsed_s = _run([sys.executable, str(SCRIPTS / script), *args])
    if _failed(rows, experiment, done, elapsed_s):
        return None
    report = own_report(done.stdout)
    rows.add(experiment, "steps_per_s", report["steps_per_s"], "steps/s")
    rows.add(experiment, "samples_per_s", report["samples_per_s"], "samples/s",
             note=f"batch {batch}; {report.get('model', '')} final loss {report['final_loss']:.3f}; {elapsed_s:.0f}s")
    return report["samples_per_s"]


def throughput_of(result: Optional[dict]) -> Optional[float]:
    """Median samples/s of a result.json read by perflab_result (None when the run failed)."""
    return Metrics.from_dict(result["metrics"]).throughput if result else None


def perflab_result(rows: Rows, experiment: str, perflab_args: list[str], out: Path) -> Optional[dict]:
    """Run `python -m perflab ...` with --out, add its rows (steps/s, samples/s, diagnosis), return result.json
    (with the script's own report, if it printed one, under "own_report")."""
    done, elapsed_s = _run([sys.executable, "-m", "perflab", *perflab_args[:1], "--out", str(out), *perflab_args[1:]])
    if _failed(rows, experiment, done, elapsed_s):
        return None
    result = json.loads((out / "result.json").read_text())
    result["own_report"] = own_report(done.stdout)
    metrics = Metrics.from_dict(result["metrics"])
    steps_per_s = metrics.steps_per_s or metrics.throughput / result["config"]["batch_size"]
    rows.add(experiment, "steps_per_s", steps_per_s, "steps/s", note=result["config"].get("step_source") or "")
    util = metrics.gpu.util_mean_pct if metrics.gpu else None
    phases = ", ".join(f"{name} {share:.0f}%" for name, share in metrics.phase_share_pct.items() if share >= 1)
    rows.add(experiment, "samples_per_s", metrics.throughput, "samples/s",
             note=f"batch {result['config']['batch_size']}; p50 {metrics.latency_ms.p50:.1f} ms; "
                  f"NVML util {util if util is None else round(util)}%; phases {phases}; {elapsed_s:.0f}s")
    diagnosis = result.get("diagnosis")
    if diagnosis:
        rows.add(experiment, "diagnosis_confidence", diagnosis["confidence"],
                 note=f"{diagnosis['bottleneck']}: {diagnosis['headline']}; levers: "
                      f"{', '.join(diagnosis['levers']) or '-'}")
    return result


def compare(rows: Rows, experiment: str, ours: Optional[float], reference: Optional[float], what: str) -> None:
    """A row with the relative difference in %, and whether it is within 5%."""
    if ours is None or reference is None:
        return
    delta = (ours - reference) / reference * 100
    rows.add(experiment, "difference", delta, "%", note=f"{ours:.1f} vs {what} {reference:.1f} samples/s; "
             f"{'within' if abs(delta) <= 5 else 'NOT within'} 5%")


def study(rows: Rows, out: Path, name: str, script: str, script_args: list[str], batch: int,
          equivalent_label: str, equivalent: list[str]) -> None:
    """Script alone, under `perflab run --`, under `perflab profile --`, and the equivalent perflab workload."""
    alone = script_alone(rows, name, script, script_args, batch)
    command = ["--", "python", str(SCRIPTS / script), *script_args]
    run = perflab_result(rows, f"{name}: perflab run --", ["run", "--warmup", str(WARMUP), *command], out / f"{name}_run")
    perflab_result(rows, f"{name}: perflab profile --", ["profile", "--warmup", str(WARMUP), *PROFILE, *command],
                   out / f"{name}_profile")
    builtin = perflab_result(rows, f"{name}: perflab run {equivalent_label}", ["run", *equivalent],
                             out / f"{name}_equivalent")
    script_under_perflab = throughput_of(run)
    compare(rows, f"{name}: script under perflab vs the equivalent workload", script_under_perflab,
            throughput_of(builtin), "perflab run workload")
    compare(rows, f"{name}: script under perflab vs the script alone", script_under_perflab, alone, "script alone")
    own = (run or {}).get("own_report")
    compare(rows, f"{name}: perflab's overhead (the script's own figure, under perflab run -- vs alone)",
            own["samples_per_s"] if own else None, alone, "script alone")


ROUNDS = 3  # interleaved rounds for a launch-bound script: it moves with the host's speed (4-6% between windows)


def rounds_study(rows: Rows, out: Path, name: str, script: str, script_args: list[str], batch: int,
                 equivalent: list[str], rounds: int) -> None:
    """A launch-bound script compared in interleaved rounds (alone, under `perflab run --`, the plugin, then again):
    one run of each, in sequence, mixes perflab's cost with the host's drift. Medians of the rounds are compared."""
    alone, under, plugin, own = [], [], [], []
    command = ["--", "python", str(SCRIPTS / script), *script_args]
    for index in range(rounds):
        tag = f"{name} round {index + 1}"
        alone.append(script_alone(rows, tag, script, script_args, batch))
        run = perflab_result(rows, f"{tag}: perflab run --", ["run", "--warmup", str(WARMUP), *command],
                             out / f"{slug(name)}_run_{index + 1}")
        under.append(throughput_of(run))
        report = (run or {}).get("own_report")
        own.append(report["samples_per_s"] if report else None)
        built = perflab_result(rows, f"{tag}: perflab run --workload (plugin)", ["run", *equivalent],
                               out / f"{slug(name)}_plugin_{index + 1}")
        plugin.append(throughput_of(built))
    medians = {label: _median(values) for label, values in
               (("alone", alone), ("run --", under), ("plugin", plugin), ("own under run --", own))}
    for label, values in (("alone", alone), ("run --", under), ("plugin", plugin)):
        done = [v for v in values if v]
        spread = 100 * (max(done) - min(done)) / medians[label] if len(done) > 1 and medians[label] else None
        rows.add(f"{name}: {label}, median of {rounds} interleaved rounds", "samples_per_s", medians[label],
                 "samples/s", f"rounds {', '.join(f'{v:.1f}' if v else '-' for v in values)}; spread "
                 f"{'-' if spread is None else f'{spread:.1f}%'}")
    compare(rows, f"{name}: script under perflab vs the equivalent workload (medians)", medians["run --"],
            medians["plugin"], "perflab run workload")
    compare(rows, f"{name}: script under perflab vs the script alone (medians)", medians["run --"], medians["alone"],
            "script alone")
    compare(rows, f"{name}: perflab's overhead (the script's own figure under perflab run -- vs alone, medians)",
            medians["own under run --"], medians["alone"], "script alone")


def _median(values: list[Optional[float]]) -> Optional[float]:
    done = [v for v in values if v]
    return float(statistics.median(done)) if done else None


def run_area(out: Path, quick: bool, only: str = "") -> list[dict]:
    """Every study, or those whose name contains `only` (BENCH_SCRIPTS_ONLY=gpt: the GPT rounds and profile)."""
    rows = Rows("scripts", out)
    if not torch.cuda.is_available():
        rows.add("(area)", "status", None, note="needs a CUDA GPU: the scripts train on cuda")
        return rows.rows
    steps = 40 if quick else 80
    timed = steps - WARMUP
    same = ["--steps", str(timed), "--trials", "1", "--warmup", str(WARMUP), "--no-check-quality"]
    resnet = ["--batch", "128", "--precision", "bf16", "--steps", str(steps), "--warmup", str(WARMUP)]
    # the GPT script is launch-bound (the GPU idles most of each step): longer runs, interleaved rounds
    gpt_steps = 40 if quick else 200
    gpt_same = ["--steps", str(gpt_steps - WARMUP), "--trials", "1", "--warmup", str(WARMUP), "--no-check-quality"]
    gpt = ["--batch", "32", "--precision", "bf16", "--steps", str(gpt_steps), "--warmup", str(WARMUP)]
    gpt_plugin = ["--workload", str(SCRIPTS / "gpt_train.py") + ":build", "--mode", "train", "--batch", "32",
                  "--precision", "bf16", *gpt_same]
    loader = ["--batch", "128", "--precision", "bf16", "--steps", "20", "--warmup", str(WARMUP),
              "--data", "loader", "--workers", "2"]  # a slow loader: few steps are enough for the diagnosis

    def gpt_studies() -> None:
        rounds_study(rows, out, "gpt train bs32 bf16", "gpt_train.py", gpt, 32, gpt_plugin, 1 if quick else ROUNDS)
        perflab_result(rows, "gpt train bs32 bf16: perflab profile --",
                       ["profile", "--warmup", str(WARMUP), *PROFILE, "--", "python", str(SCRIPTS / "gpt_train.py"),
                        *gpt], out / "gpt_profile")

    studies = [
        ("resnet50 train", lambda: study(
            rows, out, "resnet50 train bs128 bf16", "resnet50_train.py", resnet, 128, "--workload resnet50",
            ["--workload", "resnet50", "--mode", "train", "--batch", "128", "--precision", "bf16", *same])),
        ("gpt train", gpt_studies),
        ("resnet50 loader", lambda: perflab_result(
            rows, "resnet50 train bs128 bf16, DataLoader with 2 workers: perflab profile --",
            ["profile", "--warmup", str(WARMUP), *PROFILE, "--", "python", str(SCRIPTS / "resnet50_train.py"),
             *loader], out / "resnet50_loader_profile")),
    ]
    for name, run_study in studies:
        if only in name:
            run_study()
    return rows.rows


def run(out: Path, quick: bool) -> list[dict]:
    """The suite protocol: run the area, return its rows."""
    return run_area(out, quick)


def main() -> int:
    args = parse_args()
    began = time.time()
    run_area(args.out, args.quick, os.environ.get("BENCH_SCRIPTS_ONLY", ""))
    print(f"[scripts] done in {time.time() - began:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

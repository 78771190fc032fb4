"""Area "memory": perflab memory on the GPU (issue 27).

For resnet50 train, the transformer train and a planted activation-heavy MLP (tests/planted/activation_heavy.py):
- the breakdown by category beside torch.cuda.max_memory_allocated (the measured peak) and what it left unattributed;
- the peak fitted at three small batches, the largest batch found by probes in their own processes, and the fit's
  predicted peak there vs the peak measured there;
- predicted savings of activation checkpointing, bf16 autocast and the 8-bit optimizer (`--optimizer-impl 8bit`,
  torchao; skipped with the reason when torchao is missing or the optimizer is not Adam) vs measured (the same step
  with the lever on), at a batch where activations dominate: the largest the fit predicts under half the device,
  at most SAVING_BATCH_CAP times the breakdown's (at a small batch the workspace and autocast's weight copies,
  which the levers do not shrink, decide the sign);
- a real out-of-memory from `perflab run` at twice the largest batch: its exit code, whether a traceback was printed,
  and the short block (its advice from a breakdown at half that batch).
Prints a short table last; rows.json in DIR.

    python -m benchmarks.bench_memory --out DIR [--quick]        (BENCH_MEMORY_ONLY=resnet50_train,...: those cases)

--quick (or no CUDA) runs tiny sizes on the CPU under a fake memory limit: a check of the machinery, not a
measurement.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.memory.step import measure_step
from perflab.memory.study import MemoryStudy, memory_study
from perflab.report.build import write_report

ROOT = Path(__file__).resolve().parents[1]
HEAVY = str(ROOT / "tests/planted/activation_heavy.py") + ":build"
TOLERANCE = 0.05  # the search stops within 5% of the largest batch: fewer probes, the same check of the fit
SAVING_BATCH_CAP = 8  # the savings' batch: at most 8 x the breakdown's
BUDGET_S = 420  # past this, the remaining cases only get their breakdown (the area must end within 8 minutes)


def cases(quick: bool) -> list[tuple[str, RunConfig, bool]]:
    """(name, config at the breakdown's batch, whether to search the largest batch)."""
    if quick:
        return [("mlp_activation_heavy", RunConfig(workload=HEAVY, batch_size=512, device="cpu"), True),
                ("transformer_train", RunConfig(workload="transformer", batch_size=4, device="cpu"), False),
                ("resnet50_train", RunConfig(workload="resnet50", batch_size=8, device="cpu",
                                             workload_options={"image_res": 32}), False)]
    chosen = [("mlp_activation_heavy", RunConfig(workload=HEAVY, batch_size=4096, device="cuda"), True),
              ("transformer_train", RunConfig(workload="transformer", batch_size=16, device="cuda"), True),
              ("resnet50_train", RunConfig(workload="resnet50", batch_size=64, device="cuda"), True)]
    only = os.environ.get("BENCH_MEMORY_ONLY")  # comma-separated case names: one device call per case if need be
    return [case for case in chosen if not only or case[0] in only.split(",")]


def measured_peak(cfg: RunConfig) -> float:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return measure_step(cfg, categorise=cfg.device != "cuda").peak_mb


def record_breakdown(rows: Rows, name: str, study: MemoryStudy) -> None:
    breakdown = study.breakdown
    for label, mb in breakdown.rows():
        rows.add(name, f"breakdown {label}", round(mb, 1), "MiB")
    rows.add(name, "measured peak (max_memory_allocated)" if breakdown.device.startswith("cuda")
             else "measured peak (CPU allocator)", round(breakdown.peak_mb, 1), "MiB",
             f"categories sum {breakdown.attributed_mb:.1f} MiB ({breakdown.source[:40]})")
    rows.add(name, "unattributed share", round(100 * breakdown.unattributed_mb / breakdown.peak_mb, 2), "%")
    largest = breakdown.largest_module()
    if largest:
        rows.add(name, "largest activations", round(largest[1], 1), "MiB", largest[0])
    fit = study.fit
    if fit is None:
        rows.add(name, "fit", None, "", "; ".join(breakdown.notes))
        return
    rows.add(name, f"fit ({fit.model})", round(fit.per_sample_mb, 4), "MiB/sample",
             f"fixed {fit.fixed_mb:.1f} MiB over batches {fit.batches}; predicted largest batch "
             f"{study.predicted_largest_batch} under {study.capacity_mb and round(study.capacity_mb)} MiB")
    raw = study.raw_fit
    if raw is not None:
        rows.add(name, "fit (max_memory_allocated, evidence)", round(raw.per_sample_mb, 4), "MiB/sample",
                 f"fixed {raw.fixed_mb:.1f} MiB through peaks {[round(p) for p in raw.peaks_mb]} at {raw.batches}; "
                 f"predicted largest batch {raw.largest_batch(study.capacity_mb)}")


def record_search(rows: Rows, name: str, study: MemoryStudy) -> Optional[int]:
    search = study.search
    if search is None:
        return None
    rows.add(name, "largest batch that fits (probes)", search.largest_fits, "",
             f"smallest OOM {search.smallest_oom}; probes {[(p.batch, p.status) for p in search.probes]}")
    if search.largest_fits and search.largest_peak_mb and study.fit is not None:
        predicted = study.fit.predict_mb(search.largest_fits)
        error = 100 * (predicted - search.largest_peak_mb) / search.largest_peak_mb
        raw = f"; the max_memory_allocated line: {study.raw_fit.predict_mb(search.largest_fits):.0f} MiB" \
            if study.raw_fit is not None else ""
        rows.add(name, "predicted vs measured peak at the largest batch", round(error, 2), "%",
                 f"predicted {predicted:.0f} MiB ({study.fit.model}), measured {search.largest_peak_mb:.0f} MiB{raw}")
    return search.largest_fits


def saving_batch(cfg: RunConfig, study: MemoryStudy) -> int:
    """Where the savings are measured: the largest batch the peak model puts under half the capacity, capped."""
    half = study.fit.largest_batch(0.5 * study.capacity_mb) if study.fit is not None and study.capacity_mb else None
    return max(cfg.batch_size, min(half or cfg.batch_size, SAVING_BATCH_CAP * cfg.batch_size))


def record_levers(rows: Rows, name: str, cfg: RunConfig, study: MemoryStudy) -> None:
    predicted = {lever.lever: lever for lever in study.levers}
    batch = saving_batch(cfg, study)
    at = cfg.replace(batch_size=batch)
    try:
        base = study.breakdown.peak_mb if batch == cfg.batch_size else measured_peak(at)
    except Exception as err:  # the baseline does not fit at this batch after all
        rows.add(name, f"savings at batch {batch}", None, "", f"not measured: {str(err).splitlines()[0][:160]}")
        return
    rows.add(name, "savings' batch", batch, "", f"baseline peak there {base:.0f} MiB measured, "
             f"{study.fit.predict_mb(batch):.0f} MiB predicted" if study.fit else "")
    trials = [("activation checkpointing", dict(activation_checkpointing=True)),
              ("bf16 autocast", dict(precision="bf16"))]
    for lever, change in trials:
        if lever not in predicted:
            rows.add(name, f"{lever} saving", None, "", "not predicted for this configuration")
            continue
        _measure_lever(rows, name, at, study, lever, predicted[lever], change, base)
    eight_bit = predicted.get("8-bit optimizer state")
    if eight_bit is None:
        rows.add(name, "8-bit optimizer saving", None, "", f"not predicted: the optimizer is "
                 f"{study.breakdown.optimizer} (torchao's 8-bit optimizers replace Adam/AdamW)")
    elif importlib.util.find_spec("torchao") is None:
        rows.add(name, "8-bit optimizer saving", None, "", f"predicted {eight_bit.frees_mb:.0f} MiB; not measured: "
                 "torchao is not installed (pip install torchao)")
    else:
        _measure_lever(rows, name, at, study, "8-bit optimizer", eight_bit, dict(optimizer_impl="8bit"), base)


def _measure_lever(rows: Rows, name: str, cfg: RunConfig, study: MemoryStudy, lever: str, predicted, change: dict,
                   base: float) -> None:
    """The lever's saving at cfg's batch: predicted (the peak model's line less the lever's) vs measured."""
    batch = cfg.batch_size
    frees = (study.fit.predict_mb(batch) - predicted.predict_mb(batch)
             if study.fit is not None and predicted.predict_mb(batch) is not None else predicted.frees_mb)
    try:
        with_lever = measured_peak(cfg.replace(**change))
    except Exception as err:  # a lever this workload refuses, or torchao failing here
        rows.add(name, f"{lever} saving at batch {batch}", None, "", f"predicted {frees:.0f} MiB; not "
                 f"measured: {str(err).splitlines()[0][:160]}")
        return
    measured = base - with_lever
    error = 100 * (frees - measured) / measured if measured else None
    rows.add(name, f"{lever} saving at batch {batch}: predicted vs measured", error and round(error, 1), "%",
             f"predicted {frees:.0f} MiB, measured {measured:.0f} MiB (peak {base:.0f} -> {with_lever:.0f}); at "
             f"the breakdown's batch {study.breakdown.batch_size} predicted {predicted.frees_mb:.0f} MiB; "
             f"{predicted.basis[:160]}")


def real_out_of_memory(rows: Rows, name: str, cfg: RunConfig, batch: int, out: Path, limit_mb: Optional[float]) -> None:
    """`perflab run` at `batch` (twice the largest that fits): the exit code and the block it printed."""
    verb = "run" if limit_mb is None else "memory"  # on the CPU, the memory limit stands in for the device's
    extra = ["--steps", "2", "--warmup", "1", "--trials", "1"] if limit_mb is None else [
        "--memory-limit-mb", str(limit_mb)]
    command = [sys.executable, "-m", "perflab", verb, *cfg.replace(batch_size=batch).to_argv("run"), *extra,
               "--out", str(out / f"{name}_oom")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    block = [line for line in finished.stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(block) if "out of memory" in line), 0)
    shown = " | ".join(block[start:start + 8])
    traceback = "Traceback" in finished.stderr
    from_breakdown = "predicted peak at batch" in finished.stderr
    rows.add(name, f"perflab {verb} at batch {batch}: exit code", finished.returncode, "",
             f"{'TRACEBACK printed' if traceback else 'no traceback'}; advice "
             f"{'from a breakdown at half the batch' if from_breakdown else 'generic'}; "
             f"{time.perf_counter() - began:.0f}s; {shown[:700]}")
    (out / f"{name}_oom.txt").write_text(finished.stdout + finished.stderr)


def run(out: Path, quick: bool) -> list[dict]:
    quick = quick or not torch.cuda.is_available()
    rows = Rows("memory", out)
    area_began = time.perf_counter()
    for name, cfg, search in cases(quick):
        began = time.perf_counter()
        if began - area_began > BUDGET_S:
            rows.add(name, "skipped", None, "", f"the area's {BUDGET_S} s budget is spent")
            continue
        limit = None
        if quick and search:  # a fake limit: four times the batch's peak, so the search has somewhere to stop
            limit = 4 * measure_step(cfg).peak_mb
        supported = name != "resnet50_train"
        study = memory_study(cfg, out / name, find_max_batch=search, limit_mb=limit, checkpointing_supported=supported,
                             command=["benchmarks/bench_memory.py"], tolerance=TOLERANCE,
                             note=lambda text, name=name: print(f"[memory] {name}: {text}", flush=True),
                             on_probe=lambda probe, name=name: print(f"[memory] {name} probe {probe}", flush=True))
        write_report(out / name)
        record_breakdown(rows, name, study)
        largest = record_search(rows, name, study)
        record_levers(rows, name, cfg, study)
        if largest:
            real_out_of_memory(rows, name, cfg, 2 * largest, out, limit)
        rows.add(name, "wall time", round(time.perf_counter() - began, 1), "s")
    return rows.rows


SUMMARY = ("measured peak", "unattributed share", "predicted vs measured peak at the largest batch",
           "saving: predicted vs measured", "saving", "exit code", "wall time")


def print_summary(rows: list[dict]) -> None:
    """The short table, last: one line per case and figure that answers the area's questions."""
    print("\nmemory summary (case | figure | value | note)", flush=True)
    for row in rows:
        if any(word in row["metric"] for word in SUMMARY):
            note = row["note"].split(";")[0][:90] if row["note"] else ""
            print(f"  {row['experiment']:<22} | {row['metric'][:58]:<58} | {row['value']} {row['unit']} | {note}",
                  flush=True)


if __name__ == "__main__":
    arguments = parse_args()
    print_summary(run(arguments.out, arguments.quick))

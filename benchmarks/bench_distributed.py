"""Distributed area (2 GPUs: the device kind nvidia-h100-x2): the links, scaling at 1 and 2 GPUs against the scaling
model's prediction, and the levers for exposed communication on a ~1B-parameter transformer.

    BENCH_DISTRIBUTED_PART=scaling python -m benchmarks.bench_distributed --out DIR     # ~4 min on 2 H100s
    BENCH_DISTRIBUTED_PART=levers  python -m benchmarks.bench_distributed --out DIR     # ~5 min
    BENCH_DISTRIBUTED_PART=tune python -m benchmarks.bench_distributed --out DIR        # tune at the most GPUs
    BENCH_DISTRIBUTED_PART=compile python -m benchmarks.bench_distributed --out DIR     # ~3 min
    BENCH_DISTRIBUTED_PART=after python -m benchmarks.bench_distributed --out DIR       # scaling with the levers on
    BENCH_DISTRIBUTED_PART=issue12 python -m benchmarks.bench_distributed --out DIR     # issue 12's experiments
    BENCH_DISTRIBUTED_PART=fixtures python -m benchmarks.bench_distributed --out DIR    # ~1 min: 2-rank traces
    BENCH_DISTRIBUTED_WRAPPERS=ddp ...   # the levers and after parts for DDP alone (default: ddp,fsdp)
    BENCH_DISTRIBUTED_NPROC=1,2,4 ...    # scaling and after at 1, 2 and 4 GPUs (default: 1,2; device kind x4)

Each part is meant to fit one 9-minute device call (the times above are estimates, not measured); the default is
scaling,levers, which needs two calls' worth: run one part per call.

- scaling: `perflab calibrate --collectives --nproc 2` (all-reduce / reduce-scatter / all-gather, 1 MiB-1 GiB; the
  all-reduce's bus bandwidth beside NVLink 4's nominal 450 GB/s per direction, H100 SXM); `perflab scale --nproc 1,2
  --predict 2,8,64,512` for resnet50 DDP and the transformer size=1b with DDP and FSDP2: measured efficiency at 2
  GPUs beside the scaling model's prediction (and its predictions past 2 GPUs, with the assumed links and the
  overlap tax from the measured points below each count). With BENCH_DISTRIBUTED_NPROC=1,2,4 (device kind nvidia-h100-x4): calibrated over 4
  ranks, measured at 1, 2 and 4 GPUs, and the 4-GPU prediction from the 1- and 2-GPU points checked against it
- levers: the transformer size=1b profiled at the most GPUs of BENCH_DISTRIBUTED_NPROC (`perflab profile --nproc N`),
  DDP and FSDP2, before and after the levers for exposed communication: throughput, exposed-communication share,
  overlap, the verdict
- after: `perflab scale --nproc 1,2` of the transformer size=1b with the levers of `levers` on (DDP and FSDP2): the
  unprofiled scaling efficiency after the levers, against the same 1-GPU point (the levers need ranks: scale's
  1-rank point drops them)
- tune: `perflab tune --nproc N` (N: the largest of BENCH_DISTRIBUTED_NPROC) from the transformer size=1b under each
  wrapper of BENCH_DISTRIBUTED_WRAPPERS with no lever on, BENCH_DISTRIBUTED_TUNE_BUDGET each (default 150s): which
  levers it screened and kept, and its speedup
- spread: the run-to-run spread of scaling efficiency: the transformer under each wrapper run BENCH_DISTRIBUTED_REPEATS
  times (default 3) at each count of BENCH_DISTRIBUTED_NPROC, each a separate `perflab run`, against the 1-GPU median
- compile: the FSDP2 "after" with per-block compile (--fsdp-compile-blocks), profiled the same way
- issue12: resnet50 DDP at bucket sizes 1, 25, 100 MiB profiled, and the planted collectives-bound case
- fixtures: small 2-rank profiles recorded for tests/fixtures/traces/ranks (each rank's trace and rank 0's
  result.json): the planted big-gradients case under DDP and a small transformer under FSDP2

With BENCH_DISTRIBUTED_NPROC past 2 (e.g. 1,2,4), the calibration runs over the most ranks, the scale runs measure
every count, and a second table, printed last, checks the scaling model: the efficiency at the largest count
predicted from the points below it (the 1-GPU step and the overlap tax the smaller multi-GPU points show) beside
the measured one and the prediction without the tax. benchmarks/replay_scaling.py recomputes the predictions from a
copied-back scale folder on a CPU.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 unless already set). The table
printed last sums the part up.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.common import Rows, parse_args
import perflab
from perflab import RunConfig
from perflab.calibrate_collectives import cached_collectives, nominal_link
from perflab.cli import main as perflab_main
from perflab.diagnose.collectives import exposed_share_pct
from perflab.diagnose.communication import GatheredCommunication
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from perflab.report.plots import scaling_plots, sweep_plots
from perflab.sweep.predict import PredictConfig, Prediction
from perflab.sweep.scale import at_rank_counts, run_scale

ROOT = Path(__file__).resolve().parent.parent
AREA = "distributed"
PARTS = ("scaling", "levers", "after", "tune", "spread", "compile", "issue12", "fixtures")
PROFILE = CaptureOptions(wait=2, warmup=2, active=3, record_shapes=False, gzip=True)
FIXTURE_PROFILE = CaptureOptions(wait=1, warmup=1, active=2, record_shapes=True, gzip=True)
PLANTED = str(ROOT / "tests" / "planted" / "big_gradients.py") + ":build"
PREDICT = PredictConfig(predict="2,8,64,512")
# Before/after at 2 GPUs: each "after" is the levers for exposed communication of its wrapper, as tune would try them
DDP_LEVERS = dict(gradient_as_bucket_view=True, static_graph=True, ddp_comm_hook="bf16")
FSDP_LEVERS = dict(fsdp_param_dtype="bf16", fsdp_prefetch=2, fsdp_no_reshard_last=1)


def common(quick: bool) -> dict[str, Any]:
    return dict(device="cuda", mode="train", precision="bf16", check_quality=False,
                steps=8 if quick else 15, warmup=3 if quick else 5, trials=2)


def transformer_1b(quick: bool) -> RunConfig:
    """~1.1B parameters (size=1b: 20 blocks of 2048, seq 2048, vocab 32k), 4 sequences per GPU, bf16."""
    return RunConfig(workload="transformer", workload_options={"size": "1b"}, batch_size=4, **common(quick))


def rank_counts() -> list[int]:
    """BENCH_DISTRIBUTED_NPROC: the GPU counts of the scaling and after parts (default 1,2)."""
    text = os.environ.get("BENCH_DISTRIBUTED_NPROC", "1,2")
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()} | {1})
    except ValueError:
        raise SystemExit(f"BENCH_DISTRIBUTED_NPROC={text}: give GPU counts like 1,2,4") from None
    if counts[0] < 1 or len(counts) < 2:
        raise SystemExit(f"BENCH_DISTRIBUTED_NPROC={text}: give positive GPU counts past 1, like 1,2,4")
    return counts


def table_lines(header: tuple[str, ...], lines: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell, one line a row, the header first."""
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return ["  " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in [header, *lines]]


def pct(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}%"


class ModelCheck:
    """The last table with BENCH_DISTRIBUTED_NPROC past 2: at the largest count, the efficiency the scaling model
    predicted from the 1-GPU point and the overlap tax of the multi-GPU points below it, beside the measured."""

    HEADER = ("workload", "parallel", "GPUs", "measured", "predicted", "error", "without tax", "tax ms",
              "tax from")

    def __init__(self) -> None:
        self.lines: list[tuple[str, ...]] = []

    def add(self, name: str, predictions: list[Prediction]) -> None:
        """The predictions of one scale run: each recipe's row at its largest measured count past 2 GPUs."""
        largest: dict[str, Prediction] = {}
        for prediction in predictions:
            if prediction.gpus > 2 and prediction.measured_efficiency_pct is not None:
                kept = largest.get(prediction.parallel)
                if kept is None or prediction.gpus >= kept.gpus:
                    largest[prediction.parallel] = prediction
        for parallel, prediction in largest.items():
            measured = prediction.measured_efficiency_pct
            self.lines.append((name, parallel, str(prediction.gpus), pct(measured), pct(prediction.efficiency_pct),
                               f"{prediction.efficiency_pct - measured:+.1f} points",
                               pct(prediction.efficiency_without_tax_pct), f"{prediction.overlap_tax_ms or 0:.2f}",
                               prediction.overlap_tax or "none"))

    def print(self) -> None:
        if not self.lines:
            return
        print(f"[{AREA}] scaling model check: predicted from the smaller counts vs measured", flush=True)
        for line in table_lines(self.HEADER, self.lines):
            print(line, flush=True)


class Summary:
    """The rows of the last table: one per configuration measured."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str, str, str, str]] = []
        self.model_check = ModelCheck()

    def add(self, name: str, gpus: Any, throughput: Optional[float], efficiency: Optional[float] = None,
            exposed: Optional[float] = None, predicted: Optional[float] = None) -> None:
        self.lines.append((name, str(gpus), "" if throughput is None else f"{throughput:,.1f}", pct(efficiency),
                           pct(exposed), pct(predicted)))

    def print(self) -> None:
        header = ("experiment", "GPUs", "samples/s", "efficiency", "exposed comm", "predicted eff")
        print(f"[{AREA}] summary", flush=True)
        for line in table_lines(header, self.lines):
            print(line, flush=True)
        self.model_check.print()


def collectives(rows: Rows, summary: Summary, ranks: int = 2, quick: bool = False) -> None:
    """`perflab calibrate --collectives --nproc N`: bus bandwidth per kind at each size, the peak beside NVLink's."""
    began = time.time()
    code = perflab_main(["calibrate", "--collectives", "--nproc", str(ranks), "--device", "cuda"]
                        + (["--quick"] if quick else []))
    entry = cached_collectives(torch.device("cuda", 0), ranks)
    if code != 0 or entry is None:
        rows.add("collectives", "status", None, note=f"calibrate --collectives exited {code}")
        return
    for kind, results in entry["results"].items():
        for row in results:
            rows.add(f"collectives {kind} {row['bytes'] / 2**20:g} MiB", "busbw", row["busbw_gbps"], "GB/s",
                     note=f"algbw {row['algbw_gbps']:.1f} GB/s, {row['time_us']:.1f} us")
        rows.add(f"collectives {kind}", "latency", entry["latency_us"][kind], "us", note="smallest message (1 MiB)")
    link = nominal_link(torch.device("cuda", 0))
    peak = entry["peak_busbw_gbps"]["all_reduce"]
    if link:
        rows.add("collectives all_reduce", "busbw_of_nominal_link", 100 * peak / link["gbps"], "%",
                 note=f"peak all-reduce bus bandwidth {peak:.1f} GB/s vs {link['name']} {link['gbps']:g} GB/s "
                      f"(nccl-tests' busbw compares with one direction of the link); {time.time() - began:.0f}s")
    summary.add(f"all-reduce busbw {peak:.0f} GB/s", ranks, None)


def scaling(rows: Rows, summary: Summary, out: Path, name: str, base: list[RunConfig]) -> None:
    """`perflab scale --nproc 1,2[,4] --predict 2,8,64,512` for each config in `base`: measured rows, then the
    prediction at each measured count beside the measured efficiency and the predictions past them."""
    began = time.time()
    try:
        result = run_scale(at_rank_counts(base, rank_counts()), out / name, predict=PREDICT,
                           plots=sweep_plots, scaling_plots=scaling_plots)
    except Exception as err:  # one failing experiment must not lose the others' rows
        rows.add(name, "status", None, note=f"failed: {type(err).__name__}: {err}"[:300])
        return
    for row in result.rows:
        label = f"{name} {row.label}"
        if not row.ok:
            rows.add(label, "status", None, note=f"{row.status}: {row.error}"[:300])
            continue
        rows.add(label, "throughput", row.throughput, "samples/s")
        if row.world_size > 1:
            rows.add(label, "scaling_efficiency", row.efficiency_pct, "%",
                     note=f"throughput({row.world_size}) / ({row.world_size} x throughput(1))")
        else:
            summary.add(f"{name} 1 GPU", 1, row.throughput)
    for prediction in result.predictions:
        label = f"{name} {prediction.parallel} predicted at {prediction.gpus}"
        measured = prediction.measured_efficiency_pct
        rows.add(label, "predicted_efficiency", prediction.efficiency_pct, "%",
                 note=(f"step {prediction.step_ms:.1f} ms, exposed {prediction.exposed_ms:.2f} ms, "
                       f"{prediction.nodes} x {prediction.gpus_per_node} GPUs at {prediction.busbw_gbps:.0f} "
                       f"GB/s, overlap tax {prediction.overlap_tax_ms or 0:.2f} ms ("
                       f"{prediction.overlap_tax})" + (f"; measured {measured:.1f}%" if measured is not None
                                                       else "")))
        if prediction.gpus in rank_counts():
            throughput = next((row.throughput for row in result.rows if row.world_size == prediction.gpus
                               and row.ok and row.config.parallel == prediction.parallel), None)
            summary.add(f"{name} {prediction.parallel}", prediction.gpus, throughput, measured, None,
                        prediction.efficiency_pct)
    summary.model_check.add(name, result.predictions)
    for what, source in result.assumptions.items():
        rows.add(f"{name} scaling model", "assumption", None, note=f"{what}: {source}"[:300])
    rows.add(name, "elapsed", time.time() - began, "s")


def profiled(rows: Rows, summary: Summary, out: Path, name: str, cfg: RunConfig, expected: str = "") -> None:
    """`perflab profile --nproc 2`: throughput, the worst rank's exposed communication, and the verdict."""
    run_dir = out / name.replace(" ", "_")
    shutil.rmtree(run_dir, ignore_errors=True)
    began = time.time()
    try:
        result, diagnosis, _ = profile_run(cfg.workload, resolve_config(cfg, None), run_dir, PROFILE)
    except Exception as err:  # one failing experiment must not lose the others' rows
        rows.add(name, "status", None, note=f"failed: {type(err).__name__}: {err}"[:300])
        return
    rows.add(name, "throughput", result.throughput, "samples/s", note=f"profiled run, {time.time() - began:.0f}s; "
             f"levers: {', '.join(result.levers)}")
    comm = GatheredCommunication.from_dict(result.metrics.collectives) if result.metrics.collectives else None
    exposed = exposed_share_pct(comm) if comm else None
    if comm:
        rows.add(name, "nccl_ms_per_step", comm.communication_ms_per_step, "ms")
        rows.add(name, "overlap", comm.overlap_pct, "%", note="NCCL time under compute kernels (worst rank)")
        rows.add(name, "exposed_share_of_step", exposed, "%",
                 note=f"{comm.exposed_ms_per_step:.2f} ms/step of NCCL not under compute + "
                      f"{comm.host_wait_ms_per_step or 0:.2f} ms/step GPU idle in collectives' host ops; "
                      f"worst rank {comm.worst_rank}")
        for kind, figures in comm.by_kind.items():
            rows.add(name, f"{kind}_busbw", figures.busbw_gbps, "GB/s",
                     note=f"{figures.ms_per_step:.2f} ms/step, {figures.calls_per_step:.0f} calls, "
                          f"{figures.mean_message_mb or 0:.1f} MB a call")
    if diagnosis is not None:
        match = "" if not expected else (" (expected)" if diagnosis.bottleneck == expected else f" (EXPECTED {expected})")
        rows.add(name, "verdict_confidence", diagnosis.confidence,
                 note=f"{diagnosis.bottleneck}{match}: {diagnosis.headline}; levers: {', '.join(diagnosis.levers)}"[:400])
    summary.add(name, cfg.nproc, result.throughput, None, exposed)


def part_scaling(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    collectives(rows, summary, max(rank_counts()), quick)
    resnet = RunConfig(workload="resnet50", batch_size=128, **common(quick))
    scaling(rows, summary, out, "resnet50", [resnet])
    transformer = transformer_1b(quick)
    scaling(rows, summary, out, "transformer-1b", [transformer, transformer.replace(parallel="fsdp")])


def wrappers() -> list[str]:
    """BENCH_DISTRIBUTED_WRAPPERS: which wrappers the levers and after parts measure (default: ddp,fsdp)."""
    return [name.strip() for name in os.environ.get("BENCH_DISTRIBUTED_WRAPPERS", "ddp,fsdp").split(",")]


def part_levers(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    transformer = transformer_1b(quick).replace(nproc=max(rank_counts()), trials=1)
    if "ddp" in wrappers():
        profiled(rows, summary, out, "1b ddp before", transformer)
        profiled(rows, summary, out, "1b ddp after", transformer.replace(**DDP_LEVERS))
    if "fsdp" in wrappers():
        fsdp = transformer.replace(parallel="fsdp")
        profiled(rows, summary, out, "1b fsdp before", fsdp)
        profiled(rows, summary, out, "1b fsdp after", fsdp.replace(**FSDP_LEVERS))


def part_after(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    transformer = transformer_1b(quick)
    after = {"ddp": transformer.replace(parallel="ddp", **DDP_LEVERS),
             "fsdp": transformer.replace(parallel="fsdp", **FSDP_LEVERS)}
    scaling(rows, summary, out, "transformer-1b after levers", [after[name] for name in wrappers()])
    if "fsdp" in wrappers():
        # bf16 params alone (half the all-gather bytes, no prefetch past torch's own): its own scale, so that its
        # 2-GPU row is not matched with the other FSDP2 configuration's
        scaling(rows, summary, out, "transformer-1b fsdp bf16 params",
                [transformer.replace(parallel="fsdp", fsdp_param_dtype="bf16")])


def tune_budget() -> str:
    """BENCH_DISTRIBUTED_TUNE_BUDGET: the budget of each tune in the tune part (default 150s)."""
    return os.environ.get("BENCH_DISTRIBUTED_TUNE_BUDGET", "150s")


def part_tune(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    """`perflab tune --nproc N` from the transformer with no lever on, under each wrapper: does it find the levers?"""
    ranks = max(rank_counts())
    for wrapper in wrappers():
        name = f"tune {wrapper} at {ranks}"
        tune_dir = out / f"tune-{wrapper}-{ranks}"
        shutil.rmtree(tune_dir, ignore_errors=True)
        began = time.time()
        code = perflab_main(["tune", "--workload", "transformer", "--option", "size=1b", "--batch", "4",
                             "--precision", "bf16", "--device", "cuda", "--nproc", str(ranks), "--parallel", wrapper,
                             "--budget", tune_budget(), "--out", str(tune_dir)])
        try:
            record = json.loads((tune_dir / "tune.json").read_text())
        except (OSError, ValueError) as err:
            rows.add(name, "status", None, note=f"exit {code}, no tune.json: {err}"[:300])
            continue
        if not (record.get("start") or {}).get("throughput") or not (record.get("best") or {}).get("throughput"):
            rows.add(name, "status", None, note=f"exit {code}: no measured start: {record.get('stop_reason')}"[:400])
            continue
        screened = ", ".join(f"{item['label']} {item['screened_gain_pct']:+.0f}%" for item in record["screened"]
                             if item.get("screened_gain_pct") is not None)
        kept = ", ".join(record["kept"]) or "nothing"
        rows.add(name, "speedup", record["speedup"], "x",
                 note=f"{record['start']['throughput']:.1f} -> {record['best']['throughput']:.1f} samples/s; kept: "
                      f"{kept}; screened: {screened}; {record['trials']} trials in {record['spent_s']:.0f} of "
                      f"{record['budget_s']:.0f} s; exit {code}; {time.time() - began:.0f}s"[:600])
        rows.add(name, "stop", None, note=record["stop_reason"][:400])
        summary.add(f"{name}: kept {kept}", ranks, record["best"]["throughput"])


def repeats() -> int:
    """BENCH_DISTRIBUTED_REPEATS: how many separate runs of each configuration the spread part makes (default 3)."""
    return int(os.environ.get("BENCH_DISTRIBUTED_REPEATS", "3"))


def part_spread(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    """The same configuration run several times, each run its own ranks: how far its scaling efficiency moves between
    runs (the scaling model fits its overlap tax from one such run)."""
    transformer = transformer_1b(quick)
    single = []
    for repeat in range(repeats()):
        try:
            single.append(perflab.run(transformer.workload, transformer.replace(nproc=1)).throughput)
        except Exception as err:  # one failing run must not lose the others' rows
            rows.add("spread 1 GPU", "status", None, note=f"failed: {type(err).__name__}: {err}"[:300])
    if not single:
        return
    base = statistics.median(single)
    rows.add("spread 1 GPU", "throughput", base, "samples/s", note=f"runs: {', '.join(f'{x:.2f}' for x in single)}")
    summary.add("spread 1 GPU (median of runs)", 1, base)
    for wrapper in wrappers():
        for ranks in [count for count in rank_counts() if count > 1]:
            cfg = transformer.replace(nproc=ranks, parallel=wrapper)
            efficiencies = []
            for repeat in range(repeats()):
                try:
                    result = perflab.run(cfg.workload, cfg)
                    if result is None:
                        raise RuntimeError("no result came back from rank 0")
                except Exception as err:  # one failing run must not lose the others' rows
                    rows.add(f"spread {wrapper} {ranks}", "status", None,
                             note=f"failed: {type(err).__name__}: {err}"[:300])
                    continue
                efficiency = 100.0 * result.throughput / (ranks * base)
                efficiencies.append(efficiency)
                trials = [trial.throughput_samples_per_s for trial in result.trials]
                rows.add(f"spread {wrapper} {ranks} run {repeat + 1}", "scaling_efficiency", efficiency, "%",
                         note=f"{result.throughput:.2f} samples/s; trials {', '.join(f'{x:.2f}' for x in trials)}")
            if efficiencies:
                summary.add(f"spread {wrapper}: min / median / max of {len(efficiencies)} runs", ranks, None,
                            statistics.median(efficiencies),
                            predicted=None)
                rows.add(f"spread {wrapper} {ranks}", "efficiency_range", max(efficiencies) - min(efficiencies),
                         "points", note=f"min {min(efficiencies):.1f}%, median {statistics.median(efficiencies):.1f}%, "
                                        f"max {max(efficiencies):.1f}%")


def part_compile(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    """The FSDP2 levers with each block compiled before sharding (one graph for 20 identical blocks)."""
    fsdp = transformer_1b(quick).replace(nproc=2, trials=1, parallel="fsdp", rank_timeout_s=600.0)
    profiled(rows, summary, out, "1b fsdp after + per-block compile",
             fsdp.replace(**FSDP_LEVERS, fsdp_compile_blocks=True))


def part_issue12(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    resnet = RunConfig(workload="resnet50", batch_size=128, **common(quick))
    for bucket_mb in ((25.0,) if quick else (1.0, 25.0, 100.0)):
        profiled(rows, summary, out, f"resnet50 ddp bucket {bucket_mb:g} MiB",
                 resnet.replace(nproc=2, ddp_bucket_mb=bucket_mb, trials=1))
    profiled(rows, summary, out, "planted big gradients",
             RunConfig(workload=PLANTED, nproc=2, batch_size=8, steps=12, warmup=3, trials=1, device="cuda"),
             expected="collectives")


def part_fixtures(rows: Rows, summary: Summary, out: Path, quick: bool) -> None:
    """Two small 2-rank profiles kept whole under out/fixtures/<case>/ for the CPU tests of the communication
    diagnosis: each rank's trace and rank 0's result.json (with the gathered collectives)."""
    cases = {
        "ddp__big_gradients": RunConfig(workload=PLANTED, nproc=2, batch_size=8, steps=8, warmup=2, trials=1,
                                        device="cuda", check_quality=False),
        "fsdp__transformer_125m": RunConfig(workload="transformer", workload_options={"size": "125m", "seq_len": "512"},
                                            nproc=2, parallel="fsdp", batch_size=8, precision="bf16", steps=8, warmup=2,
                                             trials=1, device="cuda", check_quality=False),
    }
    for name, cfg in cases.items():
        run_dir = out / "fixtures" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            result, diagnosis, _ = profile_run(cfg.workload, resolve_config(cfg, None), run_dir, FIXTURE_PROFILE)
        except Exception as err:  # one failing case must not lose the other
            rows.add(name, "status", None, note=f"failed: {type(err).__name__}: {err}"[:300])
            continue
        comm = result.metrics.collectives
        rows.add(name, "exposed_share_of_step", exposed_share_pct(comm) if comm else None, "%",
                 note=f"{diagnosis.bottleneck if diagnosis else 'no diagnosis'}; files: "
                      f"{', '.join(sorted(path.name for path in run_dir.iterdir()))}"[:300])
        summary.add(f"fixture {name}", 2, result.throughput, None, exposed_share_pct(comm) if comm else None)


def run(out: Path, quick: bool, parts: Optional[list[str]] = None) -> list[dict]:
    parts = parts or selected_parts()
    rows = Rows(AREA, out)
    needed = max(rank_counts()) if {"scaling", "levers", "after", "tune", "spread"} & set(parts) else 2
    if torch.cuda.device_count() < needed:
        rows.add("(area)", "status", None, note=f"needs {needed} GPUs, {torch.cuda.device_count()} visible")
        return rows.rows
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    summary = Summary()
    steps = {"scaling": part_scaling, "levers": part_levers, "after": part_after, "tune": part_tune,
             "spread": part_spread,
             "compile": part_compile,
             "issue12": part_issue12, "fixtures": part_fixtures}
    for part in parts:
        began = time.time()
        steps[part](rows, summary, out, quick)
        rows.add(f"part {part}", "elapsed", time.time() - began, "s")
    summary.print()
    return rows.rows


def selected_parts() -> list[str]:
    """BENCH_DISTRIBUTED_PART: a comma list of the PARTS (default: scaling,levers)."""
    parts = [part.strip() for part in os.environ.get("BENCH_DISTRIBUTED_PART", "scaling,levers").split(",")
             if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise SystemExit(f"BENCH_DISTRIBUTED_PART: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    return parts


def main() -> int:
    args = parse_args()
    parts = selected_parts()
    began = time.time()
    run(args.out, args.quick, parts)
    print(f"[{AREA}] done in {time.time() - began:.0f}s ({', '.join(parts)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

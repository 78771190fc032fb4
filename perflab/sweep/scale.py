"""perflab scale: the same run at 1, 2, ... ranks in one command, and its scaling efficiency.

It is a sweep over --nproc (sweep.jsonl, sweep.csv, points/<label>/result.json, resumable), plus
scale.json and scaling.csv with, per point, efficiency = throughput(N) / (N x throughput(1)) against the
1-rank point with the same other settings (added when not asked for), and two plots.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch

from perflab import options
from perflab.calibrate_collectives import measured_collectives, peer_link
from perflab.config import DISTRIBUTED, RunConfig
from perflab.diagnose.communication import GatheredCommunication
from perflab.harness.progress import Reporter
from perflab.results import Result, atomic_file, write_json_atomic
from perflab.sweep.point import ScaleRow, SweepPoint
from perflab.sweep.predict import PredictConfig, Prediction, interconnect, predict_rows
from perflab.sweep.points import DrawPlots, SweepObserver, SweepSummary, run_sweep, swept_axes

SCALE_JSON = "scale.json"
SCALE_CSV = "scaling.csv"
SCALE_COLUMNS = ["label", "status", "nproc", "world_size", "throughput", "per_rank_throughput", "efficiency_pct",
                 "p50_ms", "peak_memory_mb", "quality", "flags"]
# Linear scaling is the ceiling: N ranks cannot do more than N times the work of one, so an efficiency above it
# says the figures are wrong, not that the ranks were fast.
EFFICIENCY_CEILING_PCT = 100.0
CEILING_DIGITS = 6  # an efficiency is compared with the ceiling at this many decimals (of a percent)
OVER_CEILING = ("over 100% cannot be right: the 1-rank point was slowed (a busy machine) or the ranks did "
                "different work per rank; not a figure to trust")
BUSY_POINT = "timed on a busy machine: its throughput (and efficiency) is not judged"
BUSY_BASE = "its 1-rank point was timed on a busy machine: the efficiency is not judged"


@dataclass
class ScaleSummary:
    """What `perflab scale` produced: the sweep, its rows with efficiency, and the plots written."""

    sweep: SweepSummary
    rows: list[ScaleRow]  # the sweep's points with world_size, per_rank_throughput, efficiency_pct and flags
    plots: dict[str, str] = field(default_factory=dict)
    predictions: list[Prediction] = field(default_factory=list)  # --predict: perflab/sweep/predict.py
    assumptions: dict[str, str] = field(default_factory=dict)  # the links the predictions assumed


def distributed_fields() -> list[str]:
    """The options that only mean something with several ranks (reset for the 1-rank point); --grad-accum
    is part of the recipe and stays."""
    return [declared.name for declared in options.options_of(RunConfig)
            if declared.group == DISTRIBUTED and declared.name != "grad_accum"]


def single_rank(cfg: RunConfig) -> RunConfig:
    """The same run in one process: every distributed-only option back to its default."""
    return cfg.replace(**{name: options.option_named(RunConfig, name).default for name in distributed_fields()})


def at_rank_counts(configs: Sequence[RunConfig], counts: Sequence[int]) -> list[RunConfig]:
    """Each config at each rank count; at 1 rank, without the options that need ranks."""
    return [single_rank(cfg) if count == 1 else cfg.replace(nproc=count) for cfg in configs for count in counts]


def with_single_rank(configs: Sequence[RunConfig]) -> list[RunConfig]:
    """The configs, each group of equal other settings led by its 1-rank config (added when missing)."""
    ordered: list[RunConfig] = []
    for cfg in configs:
        single = single_rank(cfg)
        if single not in ordered:
            ordered.append(single)
    for cfg in configs:
        if cfg not in ordered:
            ordered.append(cfg)
    return ordered


def _group_key(point: SweepPoint) -> str:
    skip = set(distributed_fields()) | {"out"}
    params = {name: value for name, value in point.config.to_dict().items() if name not in skip}
    return json.dumps(params, sort_keys=True, default=str)


def scaling_rows(points: Sequence[SweepPoint]) -> list[ScaleRow]:
    """Each point with world_size, throughput per rank, efficiency against its group's 1-rank point, and the flags
    that say why a point's figures cannot be trusted (a failed quality gate, a busy machine, efficiency over 100%)."""
    single = {_group_key(point): point for point in points if point.ok and point.config.nproc == 1}
    scaled = []
    for point in points:
        row = ScaleRow.of_point(point)
        base = single.get(_group_key(point))
        if row.ok:
            row.per_rank_throughput = row.throughput / row.world_size
            if base and base.throughput:
                row.efficiency_pct = 100 * row.throughput / (row.world_size * base.throughput)
            row.flags = point_flags(row, None if base is point else base)
        scaled.append(row)
    return scaled


def point_flags(row: ScaleRow, base: Optional[SweepPoint]) -> list[str]:
    """Why a finished point's figures cannot be taken as they stand (empty: nothing to say); `base`: its group's
    1-rank point, None for that point itself."""
    flags = []
    if row.quality in ("fail", "inconclusive"):
        flags.append(f"quality gate {row.quality}: {row.quality_reason or 'see its result.json'}")
    if row.busy:
        flags.append(BUSY_POINT)
    elif base is not None and base.busy:
        flags.append(BUSY_BASE)
    if over_ceiling(row.efficiency_pct):
        flags.append(f"efficiency {row.efficiency_pct:.0f}% {OVER_CEILING}")
    return flags


def over_ceiling(efficiency_pct: Optional[float]) -> bool:
    """Over 100% by more than floating-point rounding (the 1-rank point divided by itself read 100.00000000000001%)."""
    return efficiency_pct is not None and round(efficiency_pct, CEILING_DIGITS) > EFFICIENCY_CEILING_PCT


def trusted_efficiency(row: ScaleRow) -> Optional[float]:
    """The efficiency to show as a figure: None when it is over the ceiling or was timed on a busy machine."""
    efficiency = row.efficiency_pct
    if efficiency is None or over_ceiling(efficiency) or {BUSY_POINT, BUSY_BASE} & set(row.flags):
        return None
    return efficiency


def run_scale(configs: Sequence[RunConfig], out: Union[str, Path], resume: bool = False,
              observer: Optional[SweepObserver] = None, command: Optional[list[str]] = None,
              plots: Optional[DrawPlots] = None, scaling_plots: Optional[DrawPlots] = None,
              reporter_factory: Callable[[], Reporter] = Reporter,
              predict: Optional[PredictConfig] = None) -> ScaleSummary:
    """Run every config at its --nproc (and at 1 rank), then compute and save the scaling efficiency; with
    `predict`, the scaling model's step time and efficiency at its GPU counts (and at the measured ones); `plots` and
    `scaling_plots` draw the sweep's and the scaling figures (report/plots.py's sweep_plots and scaling_plots)."""
    configs = with_single_rank(configs)
    if predict is not None:
        check_prediction_inputs(predict, configs[0])
    axes = ["nproc"] + [name for name in swept_axes(configs) if name != "nproc"]
    sweep = run_sweep(configs, out, axes=axes, resume=resume, observer=observer, command=command, plots=plots,
                      reporter_factory=reporter_factory)
    rows = scaling_rows(sweep.rows)
    files: dict[str, str] = {}
    # no untrusted efficiency on a plot, nor beside a prediction as the measured figure
    trusted = [replace(row, efficiency_pct=trusted_efficiency(row)) for row in rows]
    if scaling_plots and any(row.efficiency_pct is not None for row in trusted):
        drawn = scaling_plots([row.to_dict() for row in trusted], axes, sweep.out)
        files = {name: str(path.relative_to(sweep.out)) for name, path in drawn.items()}
    predictions, assumptions = scaling_predictions(trusted, sweep.out, predict, configs[0]) if predict else ([], {})
    write_json_atomic(sweep.out / SCALE_JSON, {"kind": "scale", "axes": axes, "command": command or [],
                                               "efficiency": "throughput(N) / (N x throughput(1))",
                                               "rows": [_scale_record(row) for row in rows], "plots": files,
                                               "predictions": [prediction.to_dict() for prediction in predictions],
                                               "assumptions": assumptions})
    _write_csv(sweep.out / SCALE_CSV, rows)
    return ScaleSummary(sweep, rows, files, predictions, assumptions)


def _model_device(cfg: RunConfig) -> torch.device:
    return torch.device("cuda", 0) if cfg.device != "cpu" and torch.cuda.is_available() else torch.device("cpu")


def check_prediction_inputs(settings: PredictConfig, cfg: RunConfig) -> None:
    """The links --predict needs are known before any point runs, where that can be told without a CUDA context in
    this process (the ranks would see it as a GPU neighbour): on a CPU run, a stated or calibrated bus bandwidth. A
    GPU whose nominal link perflab knows (H100, H200, A100 ...) is checked when the model runs."""
    if settings.intra_node_gbps is None and _model_device(cfg).type == "cpu":
        interconnect(settings, measured_collectives(torch.device("cpu")), None)  # raises the one-line error


def scaling_predictions(rows: Sequence[ScaleRow], out: Path, settings: PredictConfig, cfg: RunConfig
                        ) -> tuple[list[Prediction], dict[str, str]]:
    """The scaling model from each group's 1-rank point, with the links it assumed."""
    device = _model_device(cfg)
    network = interconnect(settings, measured_collectives(device), peer_link(device))
    singles = {_group_key(row): Result.load(out / row.dir) for row in rows
               if row.ok and row.config.nproc == 1 and row.dir}
    predictions = predict_rows(list(rows), singles, network, settings.counts(), _group_key,
                               exposed_of=lambda row: profiled_exposed_ms(out, row))
    assumptions = {"within a node": network.intra.source, "between nodes": network.inter.source,
                   "gpus per node": str(network.gpus_per_node),
                   "model": "alpha-beta collectives; DDP buckets overlap backward; FSDP2 units prefetch one ahead; "
                            "the overlap tax (compute slowed by the communication it overlaps) fitted from the "
                            "measured multi-GPU points below each count (docs/distributed.md, perflab/sweep/overlap_tax.py)"}
    return predictions, assumptions


def profiled_exposed_ms(out: Path, row: SweepPoint) -> Optional[float]:
    """A point's exposed communication per step as its profile measured it (NCCL time not under compute plus the
    GPU idle in collectives' host ops, the worst rank), or None for an unprofiled point (scale's own points)."""
    if not row.dir:
        return None
    collectives = Result.load(out / row.dir).metrics.collectives
    if not collectives:
        return None
    comm = GatheredCommunication.from_dict(collectives)
    return comm.exposed_ms_per_step + (comm.host_wait_ms_per_step or 0.0)


def _scale_record(row: ScaleRow) -> dict[str, Any]:
    """A row of scale.json: the point's label, status and swept values, and its scaling figures."""
    return {"label": row.label, "status": row.status, "params": row.params,
            **{name: getattr(row, name) for name in SCALE_COLUMNS if name not in ("label", "status", "nproc")}}


def _write_csv(path: Path, rows: Sequence[ScaleRow]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(SCALE_COLUMNS)
    for row in rows:
        values = [row.config.nproc if name == "nproc" else "; ".join(row.flags) if name == "flags"
                  else getattr(row, name) for name in SCALE_COLUMNS]
        writer.writerow(["" if value is None else value for value in values])
    with atomic_file(path) as temp:
        temp.write_text(buffer.getvalue())

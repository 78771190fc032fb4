"""Rank 0 gathers every rank's figures (torch.distributed.gather_object) into the one result.json.

The global throughput of a trial is every rank's samples over the slowest rank's wall time; latency and
phases are rank 0's (in a synchronous data-parallel step every rank waits for the slowest, so the step
times agree); per-rank throughput, step time, memory and collectives are kept side by side, with the
straggler spread: how far the slowest rank's mean step time is from the fastest's.
"""
from __future__ import annotations

import dataclasses
import socket
from dataclasses import asdict
from typing import Any, Optional

import numpy as np
import torch.distributed as dist

from perflab.distributed.rank import local_rank
from perflab.harness.runner import aggregate
from perflab.results import Result, Trial


def rank_summary(result: Result) -> dict[str, Any]:
    """What one rank sends to rank 0: its trials and the figures that differ between ranks."""
    metrics = result.metrics
    return {
        "rank": dist.get_rank(),
        "local_rank": local_rank(),
        "host": socket.gethostname(),
        "trials": [asdict(trial) for trial in result.trials],
        "throughput_samples_per_s": (metrics.get("throughput_samples_per_s") or {}).get("median"),
        "step_ms_mean": (metrics.get("latency_ms") or {}).get("mean"),
        "step_ms_p50": (metrics.get("latency_ms") or {}).get("p50"),
        "phases_ms": metrics.get("phases_ms") or {},
        "memory": metrics.get("memory") or {},
        "gpu": metrics.get("gpu") or {},
        "collectives": metrics.get("collectives"),
        "notes": result.notes,
    }


def gather_result(result: Result) -> Result:
    """On rank 0, the merged result of every rank; on the other ranks, their own result unchanged."""
    summary = rank_summary(result)
    gathered: Optional[list[Any]] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(summary, gathered, dst=0)
    if gathered is None:
        return result
    return merge(result, sorted(gathered, key=lambda rank: rank["rank"]))


def global_trials(ranks: list[dict[str, Any]]) -> list[Trial]:
    """Per trial: every rank's samples over the slowest rank's wall time; step and phase times of rank 0."""
    trials = []
    for index, first in enumerate(ranks[0]["trials"]):
        wall_s = max(rank["trials"][index]["wall_s"] for rank in ranks)
        samples = sum(rank["trials"][index]["samples"] for rank in ranks)
        trials.append(Trial(wall_s=wall_s, steps=first["steps"], samples=samples,
                            throughput_samples_per_s=samples / wall_s, step_ms=first["step_ms"],
                            phase_ms=first["phase_ms"]))
    return trials


def merge(result: Result, ranks: list[dict[str, Any]]) -> Result:
    """Rank 0's result with global throughput (trials over all ranks) and the per-rank figures."""
    world = len(ranks)
    cfg = result.config
    trials = global_trials(ranks)
    if not trials:  # interrupted before a trial finished: nothing to add up
        return dataclasses.replace(result, world_size=world)
    metrics = dict(result.metrics)
    metrics.update(aggregate(trials, cfg["batch_size"]))
    metrics["batch_size"] = cfg["batch_size"]
    metrics["global_batch_size"] = cfg["batch_size"] * world
    metrics["distributed"] = distributed_summary(ranks, cfg, metrics["throughput_samples_per_s"]["median"])
    metrics["flops"] = _global_flops(metrics.get("flops") or {}, metrics["throughput_samples_per_s"]["median"],
                                     world)
    collectives = [rank["collectives"] for rank in ranks if rank["collectives"]]
    if collectives:
        metrics["collectives"] = collectives_summary(ranks)
    notes = list(dict.fromkeys(note for rank in ranks for note in rank["notes"]))
    timing = {**result.timing, "throughput": "all ranks' samples over the slowest rank's wall-clock time of the "
              "timed steps, per trial"}
    return dataclasses.replace(result, trials=trials, metrics=metrics, timing=timing, notes=notes, world_size=world)


def distributed_summary(ranks: list[dict[str, Any]], cfg: dict[str, Any], global_throughput: float) -> dict:
    """metrics.distributed: the ranks, throughput per rank, the straggler spread and every rank's figures."""
    step_means = np.array([rank["step_ms_mean"] for rank in ranks])
    fastest, slowest = float(step_means.min()), float(step_means.max())
    return {
        "world_size": len(ranks),
        "nproc_per_node": cfg.get("nproc"),
        "nnodes": cfg.get("nnodes"),
        "parallel": cfg.get("parallel"),
        "backend": dist.get_backend(),
        "global_batch_size": cfg["batch_size"] * len(ranks),
        "throughput_per_rank_samples_per_s": global_throughput / len(ranks),
        "straggler_spread_pct": 100 * (slowest - fastest) / fastest if fastest else 0.0,
        "slowest_rank": int(step_means.argmax()),
        "per_rank": [{key: rank[key] for key in ("rank", "local_rank", "host", "throughput_samples_per_s",
                                                  "step_ms_mean", "step_ms_p50", "phases_ms", "memory", "gpu")}
                     for rank in ranks],
    }


def collectives_summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's communication profile, and the worst exposed share (the rank the step waits on)."""
    per_rank = [dict(rank["collectives"], rank=rank["rank"]) for rank in ranks if rank["collectives"]]
    worst = max(per_rank, key=lambda profile: profile["exposed_share_pct"])
    return {"per_rank": per_rank, "worst_rank": worst["rank"],
            **{key: worst[key] for key in worst if key not in ("rank", "top_collectives")}}


def _global_flops(flops: dict[str, Any], global_throughput: float, world: int) -> dict[str, Any]:
    """Achieved FLOP/s over all ranks; MFU against world x one device's peak."""
    if flops.get("per_sample") is None:
        return flops
    achieved = flops["per_sample"] * global_throughput / 1e12
    peak = flops.get("peak_tflops")
    return {**flops, "achieved_tflops": achieved, "mfu_pct": 100 * achieved / (peak * world) if peak else None,
            "peak_note": f"MFU is against {world} x one device's peak"}

"""Rank 0 gathers every rank's figures (torch.distributed.gather_object) into the one result.json.

The global throughput of a trial is every rank's samples over the slowest rank's wall time; latency and
phases are rank 0's (in a synchronous data-parallel step every rank waits for the slowest, so the step
times agree); per-rank throughput, step time, memory and collectives are kept side by side, with the
straggler spread: how far the slowest rank's mean step time is from the fastest's.
"""
from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch.distributed as dist

from perflab.calibrate import percent_of_ceiling
from perflab.config import RunConfig
from perflab.diagnose.communication import (CommunicationProfile, GatheredCommunication, RankCommunication,
                                           ranks_waiting)
from perflab.distributed.rank import local_rank
from perflab.distributed.replicas import diverged
from perflab.harness.runner import aggregate
from perflab.results.metrics import Distributed, Flops, Latency, Memory, RankFigures
from perflab.results import Result, Trial


@dataclass
class RankReport:
    """What one rank sends to rank 0 (pickled by gather_object): its trials and the figures that differ."""

    figures: RankFigures
    trials: list[Trial]
    notes: list[str]
    weights_checksum: Optional[float] = None  # DDP's replicas must agree (perflab/distributed/replicas.py)


def rank_summary(result: Result, weights_checksum: Optional[float] = None) -> RankReport:
    """What one rank sends to rank 0: its trials and the figures that differ between ranks."""
    metrics = result.metrics
    latency = metrics.latency_ms or Latency()
    figures = RankFigures(rank=dist.get_rank(), local_rank=local_rank(), host=socket.gethostname(),
                          throughput_samples_per_s=metrics.throughput, step_ms_mean=latency.mean,
                          step_ms_p50=latency.p50, phases_ms=dict(metrics.phases_ms),
                          memory=metrics.memory or Memory(), gpu=metrics.gpu,
                          collectives=metrics.collectives)
    return RankReport(figures=figures, trials=list(result.trials), notes=result.notes,
                      weights_checksum=weights_checksum)


def gather_result(result: Result, weights_checksum: Optional[float] = None) -> Result:
    """On rank 0, the merged result of every rank; on the other ranks, their own result unchanged. With each DDP
    rank's `weights_checksum`, a run whose replicas differ is invalid (its gradients were not all-reduced)."""
    summary = rank_summary(result, weights_checksum)
    gathered: Optional[list[Any]] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(summary, gathered, dst=0)
    if gathered is None:
        return result
    return merge(result, sorted(gathered, key=lambda rank: rank.figures.rank))


def global_trials(ranks: list[RankReport]) -> list[Trial]:
    """Per trial: every rank's samples over the slowest rank's wall time; step and phase times of rank 0."""
    trials = []
    for index, first in enumerate(ranks[0].trials):
        wall_s = max(rank.trials[index].wall_s for rank in ranks)
        samples = sum(rank.trials[index].samples for rank in ranks)
        trials.append(Trial(wall_s=wall_s, steps=first.steps, samples=samples,
                            throughput_samples_per_s=samples / wall_s, step_ms=first.step_ms,
                            phase_ms=first.phase_ms))
    return trials


def merge(result: Result, ranks: list[RankReport]) -> Result:
    """Rank 0's result with global throughput (trials over all ranks) and the per-rank figures."""
    world = len(ranks)
    cfg = result.config
    trials = global_trials(ranks)
    if not trials:  # interrupted before a trial finished: nothing to add up
        return dataclasses.replace(result, world_size=world)
    merged = aggregate(trials, cfg.batch_size)
    metrics = dataclasses.replace(result.metrics, throughput_samples_per_s=merged.throughput_samples_per_s,
                                  latency_ms=merged.latency_ms, phases_ms=merged.phases_ms,
                                  phase_share_pct=merged.phase_share_pct, batch_size=cfg.batch_size,
                                  global_batch_size=cfg.batch_size * world)
    metrics.distributed = distributed_summary(ranks, cfg, metrics.throughput)
    metrics.flops = _global_flops(metrics.flops or Flops(), metrics.throughput, world)
    if any(rank.figures.collectives for rank in ranks):
        metrics.collectives = collectives_record(ranks)
    notes = list(dict.fromkeys(note for rank in ranks for note in rank.notes))
    timing = {**result.timing, "throughput": "all ranks' samples over the slowest rank's wall-clock time of the "
              "timed steps, per trial"}
    merged_result = dataclasses.replace(result, trials=trials, metrics=metrics, timing=timing, notes=notes,
                                        world_size=world)
    unsynchronised = diverged([rank.weights_checksum for rank in ranks])
    if unsynchronised and result.status != "interrupted":
        merged_result = dataclasses.replace(merged_result, status="invalid", status_reason=unsynchronised,
                                            notes=notes + [unsynchronised])
    return merged_result


def distributed_summary(ranks: list[RankReport], cfg: RunConfig, global_throughput: float) -> Distributed:
    """metrics.distributed: the ranks, throughput per rank, the straggler spread and every rank's figures."""
    step_means = np.array([rank.figures.step_ms_mean for rank in ranks])
    fastest, slowest = float(step_means.min()), float(step_means.max())
    return Distributed(
        world_size=len(ranks),
        nproc_per_node=cfg.nproc,
        nnodes=cfg.nnodes,
        parallel=cfg.parallel,
        backend=dist.get_backend(),
        global_batch_size=cfg.batch_size * len(ranks),
        throughput_per_rank_samples_per_s=global_throughput / len(ranks),
        straggler_spread_pct=100 * (slowest - fastest) / fastest if fastest else 0.0,
        slowest_rank=int(step_means.argmax()),
        per_rank=[dataclasses.replace(rank.figures, collectives=None) for rank in ranks],
    )


def collectives_summary(ranks: list[RankReport]) -> GatheredCommunication:
    """Every rank's communication profile, and the worst exposed share (the rank the step waits on), its by_kind
    widened by what the ranks' traces tell of the transfer and the wait."""
    per_rank = [RankCommunication.from_dict({**rank.figures.collectives, "rank": rank.figures.rank})
                for rank in ranks if rank.figures.collectives]
    worst = max(per_rank, key=lambda profile: profile.exposed_share_pct)
    figures = {name: getattr(worst, name) for name in CommunicationProfile.__dataclass_fields__}
    gathered = GatheredCommunication(**figures, worst_rank=worst.rank, per_rank=per_rank)
    gathered.by_kind = ranks_waiting([profile.by_kind for profile in per_rank], worst.by_kind)
    return gathered


def collectives_record(ranks: list[RankReport]) -> dict[str, Any]:
    """metrics.collectives as result.json holds it: the gathered communication, the worst rank's kernel names left
    in its per_rank entry."""
    record = collectives_summary(ranks).to_dict()
    record.pop("top_collectives", None)
    return record


def _global_flops(flops: Flops, global_throughput: float, world: int) -> Flops:
    """Achieved FLOP/s over all ranks; MFU against world x one device's peak."""
    if flops.per_sample is None:
        return flops
    achieved = flops.per_sample * global_throughput / 1e12
    peak = flops.peak_tflops
    mfu, over = percent_of_ceiling(achieved, peak * world if peak else None,
                                   f"achieved TFLOP/s of {world} ranks against {world} x one device's peak")
    return dataclasses.replace(flops, achieved_tflops=achieved, mfu_pct=mfu, note=over or flops.note,
                               peak_note=f"MFU is against {world} x one device's peak")

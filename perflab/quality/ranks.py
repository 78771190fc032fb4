"""The quality gate of an N-rank training run: its loss trajectory against one process on the same global batch.

Every rank trains `quality_steps` steps exactly as timed (the data-parallel wrapper, its levers, its shard
of the data); the global loss of a step is the mean of the ranks' losses. Rank 0 then trains the baseline:
one process, no levers but gradient accumulation (part of the recipe, not of the speed-up), fp32 eager, from
the same initial weights on the global batch: with the CyclingSampler split, the ranks' batches k together
are exactly batch k of one process at N x the batch size. Data-parallel averaging of gradients equals the
gradient of the mean loss over the global batch, so the two trajectories agree to rounding (docs/quality.md,
docs/distributed.md); models with BatchNorm normalise over each rank's batch, which the note says.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from perflab.step.data import DeviceBatches, first_batches, make_loader, to_device
from perflab.quality.gate import (CACHED, judge_losses, precision_tolerance, run_candidate, trained_baselines,
                                  with_noise_floor)
from perflab.levers import active_levers
from perflab.results.quality import GateCandidate, QualityVerdict

BASELINE = "one process, fp32 eager, no levers but --grad-accum, on the global batch (N x --batch), same seed and weights"


def run_distributed_quality_gate(workload, cfg, device: torch.device) -> QualityVerdict:
    """Every rank calls this; rank 0 returns the verdict, the others a pointer to it."""
    began = time.perf_counter()
    world = dist.get_world_size()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        levers, _, local_losses = run_candidate(workload, cfg, device)
        losses = torch.tensor(local_losses, dtype=torch.float64, device=device)
        dist.all_reduce(losses)
        candidate = (losses / world).tolist()
        if dist.get_rank() != 0:
            return QualityVerdict(verdict="see rank 0", reason="rank 0 judges the gathered loss trajectory")
        single = cfg.replace(nproc=1, nnodes=1, batch_size=cfg.batch_size * world)
        recipe = _recipe_levers(single)
        inputs = global_batches(workload, single, device)
        tolerance = precision_tolerance(cfg)
        baseline, nudged, cached = trained_baselines(workload, single, device, inputs, recipe,
                                                     need_nudged=tolerance.source != "--quality-loss-rtol")
        if nudged is not None:
            tolerance = with_noise_floor(tolerance, baseline, nudged)
    verdict = judge_losses(baseline, candidate, tolerance)
    verdict.mode, verdict.world_size, verdict.steps = cfg.mode, world, cfg.quality_steps
    verdict.baseline = BASELINE + (CACHED if cached else "")
    verdict.candidate = GateCandidate(levers=levers, precision=cfg.precision, ranks=world)
    verdict.tolerances, verdict.seconds = tolerance, round(time.perf_counter() - began, 3)
    if any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in workload.model.modules()):
        verdict.note = ("BatchNorm normalises over each rank's batch, the baseline over the global one: "
                           "expect small loss deltas (SyncBatchNorm would match)")
    return verdict


def _recipe_levers(cfg) -> list:
    return [lever for lever in active_levers(cfg) if lever.name == "grad-accum"]


def global_batches(workload, single, device: torch.device) -> list[Any]:
    """The batches the baseline trains on: the global batch of each step, as the ranks' shards make it up."""
    loader = make_loader(workload.dataset, single.batch_size, 0, False, False, None, workload.collate_fn, single.seed)
    data_source = workload.default_data if single.data == "auto" else single.data
    if data_source == "device":  # the ranks cycle over their first STAGED batches
        staged = first_batches(loader, DeviceBatches.STAGED)
        host = [staged[step % len(staged)] for step in range(single.quality_steps)]
    else:
        host = first_batches(loader, single.quality_steps)
    return [to_device(batch, device, non_blocking=False) for batch in host]

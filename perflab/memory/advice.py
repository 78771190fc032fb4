"""What would make a run that ran out of memory fit, computed from a breakdown at half its batch (or a quarter, an
eighth, when that does not fit either).

    items = advice_from_breakdown(cfg, tried_at=record)   # [] when no breakdown can be had, or it cannot explain

One step at half the batch is profiled for memory in this process (the failed step's memory freed first); the
line through it (model states fixed, the rest per sample) predicts the peak at the batch that failed, and each
memory lever's own line predicts its peak there. An estimate that says the failed batch fits does not explain the
OOM (something the breakdown cannot see), so the caller keeps its generic advice.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from perflab.config import RunConfig
from perflab.errors import PerflabError, is_out_of_memory
from perflab.memory.fit import largest_batch
from perflab.memory.levers import LeverSaving, lever_savings
from perflab.memory.step import measure_step, memory_limit_mb
from perflab.prepare import load

ADVICE_ITEMS = 3
# the fractions of the failed batch a breakdown is tried at, in turn: on the H100 the step at half of twice the
# largest batch that fits, profiled for memory, ran out of memory too, and the advice stayed generic
BREAKDOWN_DIVISORS = (2, 4, 8)
# levers the advice never names: nothing to switch on (perflab already does it), or several GPUs are needed
NOT_ADVISED = ("gradients set to None", "bf16 weights")


def _gib(mb: float) -> str:
    return f"{mb / 1024:.2f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


def advice_from_breakdown(cfg: RunConfig, total_mb: Optional[float]) -> list[str]:
    """Two or three changes, most likely to fit first, each with its predicted peak at cfg's batch against the
    memory there is; [] where no breakdown can be had at a half, a quarter or an eighth of the batch, or it does not
    explain the OOM."""
    batch = cfg.batch_size or 0
    capacity = memory_limit_mb() or total_mb
    if batch < 2 or capacity is None:
        return []
    breakdown = None
    for divisor in BREAKDOWN_DIVISORS:  # half first; a profiled step needs more than the plain one, so smaller next
        if batch // divisor < 1:
            break
        try:
            breakdown = measure_step(cfg.replace(batch_size=batch // divisor))
            break
        except (RuntimeError, MemoryError, PerflabError) as err:
            if is_out_of_memory(err):  # torch's error, or measure_step's own OutOfMemoryFailure: smaller next
                continue
            if isinstance(err, PerflabError):  # cannot run at all at a smaller batch
                return []
            raise
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
    if breakdown is None:
        return []
    supported = load(None, cfg).supports_activation_checkpointing if cfg.mode == "train" else None
    return rank_advice(breakdown, lever_savings(breakdown, None, capacity, checkpointing_supported=supported), batch,
                       capacity, cfg)


def rank_advice(breakdown: Any, levers: list[LeverSaving], batch: int, capacity_mb: float, cfg: Any) -> list[str]:
    """The largest batch that fits as it is, then the levers whose predicted peak at `batch` is lowest."""
    fixed = breakdown.model_states_mb
    per_sample = max(0.0, breakdown.peak_mb - fixed) / max(1, breakdown.batch_size)
    if fixed + per_sample * batch <= capacity_mb:
        return []  # the breakdown says it fits: it cannot explain this out-of-memory
    items = []
    fits = largest_batch(fixed, per_sample, capacity_mb)
    if fits:
        items.append(f"a smaller batch: --batch {fits} (predicted peak {_gib(fixed + per_sample * fits)} of {_gib(capacity_mb)}; at "
                     f"batch {batch}: {_gib(fixed + per_sample * batch)})")
    ranked = sorted((lever for lever in levers if _advisable(lever, cfg)), key=lambda lever: lever.predict_mb(batch))
    for lever in ranked[:ADVICE_ITEMS - len(items)]:
        peak = lever.predict_mb(batch)
        verdict = "fits" if peak <= capacity_mb else f"does not fit; batch {lever.batch_allowed or '?'} would"
        items.append(f"{lever.how}: predicted peak at batch {batch} {_gib(peak)} of {_gib(capacity_mb)} ({verdict})")
    return items


def _advisable(lever: LeverSaving, cfg: Any) -> bool:
    if lever.lever in NOT_ADVISED or lever.predict_mb(1) is None or not lever.frees_mb or lever.frees_mb <= 0:
        return False
    if lever.lever.startswith("FSDP") and not (torch.cuda.is_available() and torch.cuda.device_count() > 1):
        return False
    if lever.lever == "activation checkpointing" and getattr(cfg, "activation_checkpointing", False):
        return False
    return not (lever.lever == "activation checkpointing" and lever.note)  # the workload has no checkpointable blocks

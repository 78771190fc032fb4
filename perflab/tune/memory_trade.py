"""Memory for batch: when the batch search ran out of memory, the batch activation checkpointing would allow.

    batch, basis = checkpointed_batch(best_cfg, good=24, out_of_memory=32)

On the CPU the estimate is perflab.memory's: one step at the largest batch that ran, broken down in this process
(measure_step), and the checkpointing lever's own line (lever_savings) against the memory limit. On CUDA a breakdown
here would hold a CUDA context beside every trial, and without a limit on the CPU there is no capacity to fit in:
then the conservative rule, double the batch that ran, and `basis` says so.
"""
from __future__ import annotations

from typing import Any, Optional

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.memory.levers import lever_savings
from perflab.memory.step import measure_step, memory_limit_mb
from perflab.memory.study import capacity_mb
from perflab.tune.rows import MemoryTrade, TrialRow
from perflab.tune.trial import OOM

CHECKPOINTING = "activation checkpointing"  # perflab.memory.levers' name of the lever
UNDER_PREDICTION = 0.9  # the model leaves the workspace out: its largest batch comes out a few percent high
CONSERVATIVE_FACTOR = 2


def _conservative(good: int, why: str) -> tuple[int, str]:
    return CONSERVATIVE_FACTOR * good, f"{why}: conservative rule, {CONSERVATIVE_FACTOR}x batch {good}"


def checkpointed_batch(cfg: RunConfig, good: int, out_of_memory: int) -> tuple[int, str]:
    """The batch to try with activation checkpointing on (uncapped), and what the estimate rests on."""
    if cfg.device != "cpu":
        return _conservative(good, "no memory breakdown in the tuning process on CUDA")
    limit = memory_limit_mb()
    try:
        breakdown = measure_step(cfg.replace(batch_size=good, activation_checkpointing=False), limit_mb=limit,
                                 count_autocast=False)  # only the checkpointing saving is read
    except (RuntimeError, MemoryError, PerflabError) as err:
        return _conservative(good, f"no memory breakdown at batch {good} ({str(err).splitlines()[0][:80]})")
    capacity = capacity_mb(breakdown, limit)
    lever = _checkpointing(lever_savings(breakdown, None, capacity, checkpointing_supported=True))
    if lever is None or lever.batch_allowed is None:
        why = "no memory capacity to fit in" if capacity is None else "the breakdown counts no checkpointable activations"
        return _conservative(good, why)
    batch = int(UNDER_PREDICTION * lever.batch_allowed)
    return batch, (f"memory model: a breakdown at batch {good} predicts checkpointing allows batch "
                   f"{lever.batch_allowed} in {capacity:,.1f} MiB (x {UNDER_PREDICTION} for the workspace it leaves "
                   f"out); batch {out_of_memory} ran out of memory without it")


def _checkpointing(levers: list[Any]) -> Optional[Any]:
    return next((lever for lever in levers if lever.lever == CHECKPOINTING), None)


def trade_verdict(row: TrialRow, trade: MemoryTrade) -> str:
    """One line on the pair's outcome (its trial's `row`): kept, or why not."""
    decision = row.decision
    why = decision.why if decision is not None else None
    batch, good = trade.batch_tried, trade.batch_ran
    head = f"checkpointing + batch {batch} ({batch / good:.1f}x batch {good})"
    if row.kept:
        return f"{head}: kept ({why})"
    if row.status == OOM:
        return f"{head}: not kept: ran out of memory even with checkpointing"
    if row.measured and row.judged:
        gain = decision.gain_pct if decision is not None else None
        slower = gain is not None and gain < 0
        return (f"{head}: not kept: {'slower' if slower else 'no significant gain'}: recomputing the activations costs "
                f"more than the larger batch gains ({why})")
    return f"{head}: not kept ({row.status}: {why or row.reason})"

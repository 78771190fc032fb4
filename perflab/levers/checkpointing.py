"""--activation-checkpointing: recompute each block's activations in backward instead of storing them.

Trades compute (about one extra forward) for activation memory, so a larger batch or sequence fits.
The workload does the wrapping: its `build(cfg)` reads `cfg.activation_checkpointing` and runs its
blocks through torch.utils.checkpoint (use_reentrant=False); it declares that it does so with
`Workload.supports_activation_checkpointing`. Losses and gradients are those of the plain run.
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import ACTIVATION_MEMORY
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints


def _needs_support(cfg, workload, device) -> Optional[str]:
    if not workload.supports_activation_checkpointing:
        return (f"{workload.name} declares no checkpointable blocks "
                "(Workload.supports_activation_checkpointing is False); try --workload transformer")
    return None


def _apply(plan, cfg) -> None:
    plan.notes.append("activation checkpointing: blocks recompute their activations in backward "
                      "(lower peak memory, about one extra forward of compute)")


LEVERS = [
    Lever("activation-checkpointing", "activation_checkpointing", True,
          "recompute block activations in backward: less activation memory for more compute",
          "--mode train, a workload with checkpointable blocks", (Address(ACTIVATION_MEMORY, 1),), 45, _apply,
          in_code="torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) around blocks",
          when_lost="checkpointing lost: a smaller batch with gradient accumulation, or lower precision",
          tune=TuneHints(ONE_TRIAL), checks=_needs_support),
]

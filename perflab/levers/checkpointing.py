"""--activation-checkpointing: recompute each block's activations in backward instead of storing them.

Trades compute (about one extra forward) for activation memory, so a larger batch or sequence fits.
The workload does the wrapping: its `build(cfg)` reads `cfg.activation_checkpointing` and runs its
blocks through torch.utils.checkpoint (use_reentrant=False); it declares that it does so with
`Workload.supports_activation_checkpointing`. Losses and gradients are those of the plain run.
"""
from __future__ import annotations

from typing import Optional

from perflab.levers import Lever


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
          "--mode train, a workload with checkpointable blocks", ("activation memory",), 45, _apply, _needs_support),
]

"""FLOPs per sample, counted by torch.utils.flop_counter on one real step of the eager model."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops_per_sample(plan, batch: Any) -> Optional[float]:
    """Forward (infer) or forward + backward (train) FLOPs of one batch, divided by the batch size.

    The optimizer step is not counted (it is O(parameters), not O(samples)). Returns None when the
    counter cannot trace the model.
    """
    if plan.custom_step is not None:  # generation: see metrics.generation's bandwidth bound instead
        return None
    inputs, target = plan.to_device(batch)
    model = plan.eager_model
    counter = FlopCounterMode(display=False)
    try:
        with counter, plan.autocast():
            if plan.mode == "train":
                loss = plan.loss_fn(model(inputs), target)
                loss.backward()
            else:
                with torch.no_grad():
                    model(inputs)
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    finally:
        model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / plan.batch_size

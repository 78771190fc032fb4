"""FLOPs per sample, counted by torch.utils.flop_counter on one real step of the eager model."""
from __future__ import annotations

from typing import Any, Optional

import torch

from perflab.errors import UserCodeError, is_out_of_memory
from perflab.step.calls import call_loss, call_model
from perflab.workloads.contract import check_loss_value

# What the counter's tracing raises on a model it cannot follow; anything else is the model's own error.
UNCOUNTABLE = (RuntimeError, NotImplementedError, TypeError)
from perflab.step.data import map_tensors


def count_flops_per_sample(plan, batch: Any) -> Optional[float]:
    """Forward (infer) or forward + backward (train) FLOPs of one batch, divided by the batch size.

    The optimizer step is not counted (it is O(parameters), not O(samples)). Returns None when the
    counter cannot trace the model; the timed steps then report the model's own error, if it has one.
    """
    if plan.custom_step is not None:  # generation: see metrics.generation's bandwidth bound instead
        return None
    model = plan.eager_model
    if model is None:  # wrapped for data parallelism and not copyable: counting on the live model is not safe
        return None
    inputs, target = plan.to_device(batch)
    if any(param.is_meta for param in model.parameters()):  # a replica without storage (DDP, FSDP): shapes suffice
        inputs, target = map_tensors((inputs, target), lambda tensor: tensor.to("meta"))
    from torch.utils.flop_counter import FlopCounterMode  # here: it imports triton, a tenth of a second
    counter = FlopCounterMode(display=False)
    try:
        with counter, plan.autocast():
            if plan.mode == "train":
                loss = call_loss(plan.loss_fn, call_model(model, inputs), target)
                # the contract's loss rule, once: the timed loop's backward would fail with a raw torch error
                check_loss_value(plan.workload.name, plan.workload.loss_fn, loss)
                loss.backward()
            else:
                with torch.no_grad():
                    call_model(model, inputs)
    except UNCOUNTABLE as err:
        if is_out_of_memory(err):  # not the counter's limit: the step does not fit (a result, docs/memory.md)
            raise
        return None
    except UserCodeError as err:
        if isinstance(err.error, UNCOUNTABLE):
            return None
        raise
    finally:
        model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / plan.batch_size

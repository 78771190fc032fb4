"""How perflab calls the user's model and loss, and what it reads back from the model's output.

The calling rule (README "Your own workload"): a dict (any mapping) input is passed as keyword arguments,
`model(**inputs)`, the way Hugging Face models take `input_ids=..., attention_mask=...`; a tuple or list as
positional arguments, `model(*inputs)`; anything else (a tensor) as the one argument, `model(inputs)`.

The timed loop, the FLOP counter, CUDA-graph capture, stream pipelining and the quality gate all call the
model through `call_model`. A failure inside the call becomes a `UserCodeError` that says what perflab was
doing; the try costs nothing per step while nothing raises.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from perflab.errors import PerflabError, UserCodeError, is_users_fault
from perflab.workloads.contract import check_loss_value


def call_model(model: Callable, inputs: Any) -> Any:
    """Call `model` on a batch's inputs: mapping -> keywords, tuple/list -> positional, else one argument."""
    try:
        if isinstance(inputs, torch.Tensor):  # the common case first: one C-level check per step
            return model(inputs)
        if isinstance(inputs, Mapping):
            return model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return model(*inputs)
        return model(inputs)
    except Exception as err:
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"calling your model's forward on {describe_value(inputs, 'a batch')}", err) from err


def call_loss(loss_fn: Callable, output: Any, target: Any) -> torch.Tensor:
    """loss_fn(output, target), with the model's output passed as it came."""
    try:
        return loss_fn(output, target)
    except Exception as err:
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"calling your loss_fn on the model's {describe_value(output, 'output')} and "
                            f"{describe_value(target, 'a target')}", err) from err


def check_first_loss(plan, batch: Any) -> None:
    """The contract's loss rule on one eager forward of a host `batch`, for a command whose first step is not the
    FLOP count's (which checks it on its way): once, before any backward could fail on a wrong loss."""
    model = plan.eager_model
    if plan.mode != "train" or plan.custom_step is not None or model is None:
        return
    if any(param.is_meta for param in model.parameters()):  # a replica without storage: the live model decides
        return
    try:
        batch = plan.to_device(batch)
        inputs, target = plan.gpu_transform(batch) if plan.gpu_transform is not None else batch
        with plan.autocast():
            loss = call_loss(plan.loss_fn, call_model(model, inputs), target)
    except Exception:  # not the loss's contract: the first real step meets the same failure and reports it
        return
    check_loss_value(plan.workload.name, plan.workload.loss_fn, loss)


def inputs_from_call(args: tuple, kwargs: dict) -> Any:
    """The inputs that `call_model` turns into `model(*args, **kwargs)` (the rule, inverted).

    Wrappers that stand in for the model (the quality gate's recorder, the pipelined model) use it to see
    the batch's inputs whole.
    """
    if kwargs:
        return dict(kwargs)
    if len(args) == 1 and not isinstance(args[0], (Mapping, tuple, list)):
        return args[0]
    return tuple(args)


def describe_value(value: Any, article_noun: str) -> str:
    """'a batch of type dict with keys input_ids, attention_mask', '... of type Tensor with shape (8, 16)'."""
    text = f"{article_noun} of type {type(value).__name__}"
    if isinstance(value, torch.Tensor):
        return f"{text} with shape {tuple(value.shape)} and dtype {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, Mapping):
        return f"{text} with keys {', '.join(map(str, value.keys())) or '(none)'}"
    if isinstance(value, (tuple, list)):
        return f"{text} of {len(value)} items ({', '.join(type(item).__name__ for item in value)})"
    return text


def _fields(output: Any) -> Optional[list[tuple[str, Any]]]:
    """(name, value) of a mapping's entries or a dataclass's fields (a transformers ModelOutput is both)."""
    if isinstance(output, Mapping):
        return list(output.items())
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [(f.name, getattr(output, f.name)) for f in dataclasses.fields(output)]
    return None


def floating_tensors(output: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in an output, in order: tensor, tuple/list, dict, dataclass, nested."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    fields = _fields(output)
    values = [value for _, value in fields] if fields is not None else (
        output if isinstance(output, (tuple, list)) else [])
    return [tensor for value in values for tensor in floating_tensors(value)]


def count_non_finite(output: Any) -> int:
    """How many NaN/inf values the floating tensors of an output (or a loss) hold: a diverged model's timings mean
    nothing, so run and serve both read this once after they measure."""
    return sum(int((~torch.isfinite(t.detach())).sum()) for t in floating_tensors(output))


def output_entry(output: Any, key: str) -> Any:
    """The entry `key` of a dict/dataclass output; a PerflabError naming the entries there are if absent."""
    fields = _fields(output)
    names = [name for name, _ in fields] if fields is not None else []
    if key not in names:
        there = f"its entries are {', '.join(names)}" if names else f"it is a {type(output).__name__}, without names"
        raise PerflabError(f"Workload.output_key is {key!r}, but the model's output has no such entry ({there}); "
                           "set output_key to one of them, or leave it unset to compare every floating tensor")
    return dict(fields)[key]


def compared_tensors(output: Any, output_key: Optional[str]) -> list[torch.Tensor]:
    """What the quality gate compares: the floating tensors of `output[output_key]`, or of the whole output."""
    return floating_tensors(output if output_key is None else output_entry(output, output_key))


def logits_of(output: Any, output_key: Optional[str]) -> Optional[torch.Tensor]:
    """The tensor top-1 agreement reads: output_key's, else a 'logits' entry, else the first floating tensor."""
    if output_key is None:
        fields = _fields(output)
        if fields is not None and "logits" in dict(fields):
            output_key = "logits"
    tensors = compared_tensors(output, output_key)
    return tensors[0] if tensors else None

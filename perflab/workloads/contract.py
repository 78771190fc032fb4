"""The Workload contract, checked once before any step runs: one line per broken rule, naming what to do.

The model is an nn.Module with its parameters on a real device, the dataset's `__len__` a non-negative int, and (to
train) a loss_fn returning a one-element tensor that requires grad. The loss can only be seen after a forward, so
`check_loss_value` is called by the first eager step (the FLOP count), never from the timed loop.
"""
from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import torch
from torch import nn

from perflab.errors import PerflabError, UserCodeError, is_users_fault
from perflab.workloads.base import Workload


class DatasetShorterThanBatch(PerflabError):
    """A batch larger than the dataset; `flag` is the option that set the batch (serve's is --batcher-max-batch)."""

    def __init__(self, spec: str, items: int, batch: int, flag: str = "--batch"):
        self.spec, self.items, self.batch = spec, items, batch
        super().__init__(f"{spec}: Workload.dataset has {items} items, fewer than one batch of {batch}; use {flag} "
                         f"{items} or less, or set Workload(repeat_items=True) to repeat items within a batch")

    def naming(self, flag: str) -> "DatasetShorterThanBatch":
        """The same refusal, telling the user to lower `flag`."""
        return DatasetShorterThanBatch(self.spec, self.items, self.batch, flag)


def check_contract(spec: str, workload: Workload, cfg) -> None:
    """Refuse a workload that breaks the contract, before it is moved to its device or timed."""
    if not hasattr(workload.model, "parameters"):
        raise PerflabError(f"{spec}: Workload.model must be a torch.nn.Module")
    _check_real_device(spec, workload.model)
    length = dataset_length(spec, workload.dataset)
    if length == 0:
        raise PerflabError(f"{spec}: Workload.dataset is empty; give it at least one (input, target) item")
    if cfg.batch_size and length < cfg.batch_size and not workload.repeat_items:
        raise DatasetShorterThanBatch(spec, length, cfg.batch_size)
    if cfg.mode == "train" and workload.loss_fn is None:
        raise PerflabError(f"{spec}: --mode train needs Workload.loss_fn; set it or run with --mode infer")
    if cfg.mode == "train" and not any(p.requires_grad for p in workload.model.parameters()):
        raise PerflabError(f"{spec}: --mode train needs a model with trainable parameters and this one has none "
                           "(nothing for the optimizer to step); run it with --mode infer")


def dataset_length(spec: str, dataset: Any) -> int:
    """len(dataset), refused in one line unless `__len__` returns a non-negative int; its exceptions show the user's
    frames."""
    if not callable(getattr(type(dataset), "__len__", None)):
        raise PerflabError(f"{spec}: Workload.dataset must be a map-style torch Dataset with __len__")
    try:
        length = type(dataset).__len__(dataset)  # not len(): its own TypeError/ValueError would hide the value
    except (Exception, SystemExit) as err:
        if not is_users_fault(err):
            raise
        raise UserCodeError(f"asking your {spec} Workload.dataset for its length (__len__)", err) from err
    if isinstance(length, bool):
        length = None  # True/False pass as ints to len(), but a length is never a truth value
    try:
        length_int = operator.index(length)  # an int or what len() takes as one (numpy integers)
    except TypeError:
        raise PerflabError(f"{spec}: Workload.dataset's __len__ {_where(type(dataset).__len__)}returned {length!r} "
                           f"({type(length).__name__}); it must return the number of items as an int") from None
    if length_int < 0:
        raise PerflabError(f"{spec}: Workload.dataset's __len__ {_where(type(dataset).__len__)}returned "
                           f"{length_int}; it must return the number of items, 0 or more")
    return length_int


def _check_real_device(spec: str, model: nn.Module) -> None:
    """A model built on the meta device (shapes without storage) has nothing to compute with; say how to fill it."""
    tensors = [*model.named_parameters(), *getattr(model, "named_buffers", lambda: [])()]
    on_meta = [name for name, tensor in tensors if tensor.is_meta]
    if on_meta:
        more = f" and {len(on_meta) - 1} more" if len(on_meta) > 1 else ""
        raise PerflabError(f"{spec}: Workload.model has tensors on the meta device (shapes without data: "
                           f"{on_meta[0]}{more}); build it on a real device, or call model.to_empty(device='cpu') "
                           "and initialise or load its weights before returning it")


def check_loss_value(name: str, loss_fn: Callable, loss: Any) -> None:
    """Refuse a training loss that backward cannot start from: called once, on the first eager step."""
    where = _where(loss_fn)
    if not isinstance(loss, torch.Tensor):
        raise PerflabError(f"{name}: Workload.loss_fn {where}returned a {type(loss).__name__}, not a tensor; return "
                           "the loss tensor itself (not loss.item() or float(loss)) so backward can reach the model")
    if loss.numel() != 1:
        raise PerflabError(f"{name}: Workload.loss_fn {where}returned a tensor of shape {tuple(loss.shape)}, not a "
                           "scalar; reduce it to one number (e.g. .mean() or .sum()) so backward can start from it")
    if not loss.requires_grad:
        raise PerflabError(f"{name}: Workload.loss_fn {where}returned a tensor that does not require grad, so "
                           "backward cannot reach the model; compute it from the model's output (no .detach(), "
                           "torch.no_grad() or new tensors built from .item())")


def _where(function: Callable) -> str:
    """'at file:line ' of the user's function (or of the class of a callable object), '' when it is not theirs."""
    from perflab.user_frames import is_user_file  # user_frames imports perflab

    target = function if inspect.isroutine(function) else type(function)
    try:
        path, line = inspect.getsourcefile(target), inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return ""
    return f"at {path}:{line} " if path and is_user_file(path) else ""

"""Activations saved for backward, by module: saved-tensor hooks while forward runs, worn as a context manager.

Each tensor autograd saves is counted once (by storage), against the innermost module running when it was
saved; parameters and the batch's own tensors are not activations. The repeated blocks (the children of the
largest ModuleList/Sequential) are measured too, with their inputs: what activation checkpointing would keep.
Under autocast the bytes are counted by dtype, and the low-precision casts of parameters autocast saves (one per
weight, cached during forward) apart from the activations: they do not grow with the batch.
`saved_under_autocast` runs one forward under bf16 autocast (no backward) to count what autocast would save.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from perflab.step.calls import call_model

TOP_MODULES = 5


@dataclass
class SavedActivations:
    """MiB saved for backward: in all, per module, and per repeated block (with the block's input)."""

    total_mb: float = 0.0
    by_module_mb: dict[str, float] = field(default_factory=dict)
    blocks: str = ""  # the container whose children are the blocks, e.g. "layers"
    block_saved_mb: list[float] = field(default_factory=list)
    block_input_mb: list[float] = field(default_factory=list)
    by_dtype_mb: dict[str, float] = field(default_factory=dict)  # the activations by dtype, e.g. {"bfloat16": ...}
    parameter_copies_mb: float = 0.0  # low-precision casts of parameters saved for backward (autocast's weights)
    output_fp32_mb: float = 0.0  # the model's floating outputs at 4 bytes an element: what an fp32 loss takes

    def largest(self) -> Optional[tuple[str, float]]:
        return max(self.by_module_mb.items(), key=lambda item: item[1]) if self.by_module_mb else None

    def top(self) -> dict[str, float]:
        ranked = sorted(self.by_module_mb.items(), key=lambda item: -item[1])[:TOP_MODULES]
        return dict(ranked)

    def checkpointed_mb(self, temporaries_mb: float = 0.0) -> Optional[float]:
        """Activations alive at the step's peak with every block checkpointed: the rest and the blocks' inputs, plus
        what one block recomputed in backward holds beyond the temporaries alive at the peak (the loss and its
        gradient are freed before the first block is recomputed: on the H100 the transformer's checkpointed peak
        held no recomputed block over its 1.5 GB of logits); None without repeated blocks."""
        if len(self.block_saved_mb) < 2:
            return None
        inside = sum(self.block_saved_mb)
        recomputed_beyond_peak = max(0.0, max(self.block_saved_mb) - temporaries_mb)
        return self.total_mb - inside + sum(self.block_input_mb) + recomputed_beyond_peak

    def to_dict(self) -> dict[str, Any]:
        return {"total_mb": self.total_mb, "by_module_mb": self.top(), "blocks": self.blocks,
                "block_saved_mb": self.block_saved_mb, "block_input_mb": self.block_input_mb,
                "by_dtype_mb": self.by_dtype_mb, "parameter_copies_mb": self.parameter_copies_mb,
                "output_fp32_mb": self.output_fp32_mb}

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[SavedActivations]:
        """memory.json's form; keys an older file lacks take their defaults; None for {}."""
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data}) if data else None


def repeated_blocks(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The children of the ModuleList/Sequential (two or more) holding the most parameters: the checkpoint units."""
    best, best_params = ("", []), 0
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) >= 2:
            params = sum(p.numel() for p in module.parameters())
            if params > best_params:
                best, best_params = (name, list(module)), params
    return best


def _storage_key(tensor: torch.Tensor) -> tuple[Any, int]:
    storage = tensor.untyped_storage()
    return (tensor.device, storage.data_ptr()), storage.nbytes()


class ActivationAccounting:
    """`with ActivationAccounting(model, exclude=batch_tensors) as saved:` around forward; then `saved.result`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.result = SavedActivations()
        self._stack: list[str] = []
        self._seen: set = set()
        self._by_module: dict[str, float] = defaultdict(float)
        self._by_dtype: dict[str, float] = defaultdict(float)
        self._block_of: dict[int, int] = {}
        self._block_saved: list[float] = []
        self._block_input: list[float] = []
        self._excluded = {_storage_key(p)[0] for p in model.parameters()}
        self._exits = ExitStack()

    def __enter__(self) -> "ActivationAccounting":
        name, blocks = repeated_blocks(self.model)
        self.result.blocks = name
        self._block_of = {id(block): index for index, block in enumerate(blocks)}
        self._block_saved = [0.0] * len(blocks)
        self._block_input = [0.0] * len(blocks)
        self._block_index: list[int] = []
        for module_name, module in self.model.named_modules():
            self._exits.callback(module.register_forward_pre_hook(self._enter_module(module_name or "(model)", module),
                                                                       with_kwargs=True).remove)
            self._exits.callback(module.register_forward_hook(self._leave_module(module)).remove)
        self._exits.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda packed: packed))
        return self

    def __exit__(self, *exc) -> None:
        self._exits.close()
        self.result.total_mb = sum(self._by_module.values())
        self.result.by_module_mb = dict(self._by_module)
        self.result.by_dtype_mb = dict(self._by_dtype)
        self.result.block_saved_mb = self._block_saved
        self.result.block_input_mb = self._block_input

    def _enter_module(self, name: str, module: nn.Module):
        def hook(_module, args, kwargs):
            self._stack.append(name)
            if module is self.model:  # the batch is an input, not an activation
                self._excluded |= {_storage_key(t)[0] for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)}
            index = self._block_of.get(id(module))
            if index is not None:
                self._block_index.append(index)
                self._block_input[index] += sum(_storage_key(a)[1] for a in args
                                                 if isinstance(a, torch.Tensor)) / 2**20
        return hook

    def _leave_module(self, module: nn.Module):
        def hook(_module, _args, _output):
            if self._stack:
                self._stack.pop()
            if id(module) in self._block_of and self._block_index:
                self._block_index.pop()
        return hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._stack or tensor.layout != torch.strided:
            return tensor  # outside any module (the loss) or sparse: not a module's activation
        key, nbytes = _storage_key(tensor)
        if key in self._excluded or key in self._seen:
            return tensor  # a parameter, the batch itself, or already counted
        self._seen.add(key)
        if _is_parameter_cast(tensor):
            self.result.parameter_copies_mb += nbytes / 2**20
            return tensor
        self._by_dtype[str(tensor.dtype).removeprefix("torch.")] += nbytes / 2**20
        self._by_module[self._stack[-1]] += nbytes / 2**20
        if self._block_index:
            self._block_saved[self._block_index[-1]] += nbytes / 2**20
        return tensor


def _is_parameter_cast(tensor: torch.Tensor) -> bool:
    """A dtype cast of a parameter (autocast's cached weight), or a view of one (linear saves the transpose): a copy
    whose input is a leaf."""
    base = tensor._base if tensor._base is not None else tensor
    grad_fn = base.grad_fn
    if grad_fn is None or type(grad_fn).__name__ != "ToCopyBackward0" or not grad_fn.next_functions:
        return False
    source = grad_fn.next_functions[0][0]
    return source is not None and type(source).__name__ == "AccumulateGrad"


def saved_under_autocast(model: nn.Module, inputs: Any, device: torch.device,
                         dtype: torch.dtype = torch.bfloat16) -> SavedActivations:
    """What autocast would save for backward: one forward of `inputs` under autocast to `dtype`, counted by the
    saved-tensor hooks; no backward (the graph is dropped with the output)."""
    with ActivationAccounting(model) as saved, torch.autocast(device.type, dtype=dtype):
        output = call_model(model, inputs)
    saved.result.output_fp32_mb = sum(4 * leaf.numel() for leaf in tree_leaves(output)
                                      if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()) / 2**20
    del output
    return saved.result

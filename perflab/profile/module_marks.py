"""nn.Module paths in a profiler trace: a `module: <qualified name>` record_function range around every
submodule's forward, so the operator view can say which module ran each op (and, through autograd's sequence
numbers, each backward op) without the Python tracer that `with_stack` needs.

Worn only while the profiler records; an eager model only (a compiled one would graph-break on the hooks).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

MODULE_MARK = "module: "  # read by perflab.diagnose.op_graph


@contextmanager
def module_marks(model: nn.Module, loss_fn=None) -> Iterator[None]:
    """Mark every submodule's forward with a record_function range named after its path in `model`; a loss that is
    an nn.Module is marked `loss` (a sync in the loss is then named there)."""
    handles = []
    open_ranges: list = []

    def enter(name: str):
        def pre_hook(module, args):
            handle = torch.ops.profiler._record_function_enter_new(MODULE_MARK + name, None)
            open_ranges.append(handle)
        return pre_hook

    def leave(module, args, output):
        if open_ranges:
            torch.ops.profiler._record_function_exit(open_ranges.pop())

    named = list(model.named_modules())
    if isinstance(loss_fn, nn.Module) and loss_fn is not model:
        named += [(f"loss.{name}" if name else "loss", module) for name, module in loss_fn.named_modules()]
    for name, module in named:
        handles.append(module.register_forward_pre_hook(enter(name or type(module).__name__)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

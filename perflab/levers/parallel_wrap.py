"""Wrap a plan's model for data parallelism: DistributedDataParallel, or FSDP2's fully_shard per block.

Called by the data-parallel lever (perflab/levers/distributed.py) inside a rank, after the settings levers
have put the wrapper's options into `plan.parallel_options`.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn


def wrap_ddp(plan) -> None:
    """plan.model becomes DDP(plan.model) with the plan's bucket settings; no_sync skips the all-reduce."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [plan.device.index] if plan.device.type == "cuda" else None
    wrapped = DistributedDataParallel(plan.model, device_ids=device_ids, **plan.parallel_options)
    plan.model = wrapped
    plan.skip_gradient_sync = wrapped.no_sync


def register_compression_hook(plan, dtype: str) -> None:
    """Send DDP's gradient buckets as bf16 or fp16 (half the bytes), averaged and cast back to fp32."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = default_hooks.bf16_compress_hook if dtype == "bf16" else default_hooks.fp16_compress_hook
    plan.model.register_comm_hook(dist.group.WORLD, hook)


def fully_shard_function():
    """FSDP2's fully_shard: public in torch.distributed.fsdp from torch 2.6, under _composable before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def shard_blocks(model: nn.Module) -> Iterator[nn.Module]:
    """The repeated blocks to shard on their own: members of a ModuleList/Sequential that own parameters
    (outermost only); the root is sharded last, holding whatever is left (embeddings, heads)."""
    for child in model.children():
        if isinstance(model, (nn.ModuleList, nn.Sequential)) and any(True for _ in child.parameters()):
            yield child
        else:
            yield from shard_blocks(child)


def wrap_fsdp(plan) -> None:
    """fully_shard every block, then the root; the optimizer is rebuilt over the sharded parameters."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fully_shard_function()
    mesh = init_device_mesh(plan.device.type, (dist.get_world_size(),))
    options = {"mesh": mesh, "reshard_after_forward": plan.parallel_options.get("reshard_after_forward", True)}
    names = {id(param): name for name, param in plan.model.named_parameters()}
    # FLOPs are counted on an unsharded replica without storage: a sharded model's forward all-gathers
    plan.eager_model = copy.deepcopy(plan.model).to("meta")
    for block in list(shard_blocks(plan.model)):
        fully_shard(block, **options)
    fully_shard(plan.model, **options)
    if plan.optimizer is not None:
        plan.optimizer = _rebuild_over(plan.optimizer, names, dict(plan.model.named_parameters()))
    model = plan.model
    plan.skip_gradient_sync = lambda: _without_gradient_sync(model)


def _rebuild_over(optimizer: torch.optim.Optimizer, names: dict[int, str],
                  sharded: dict[str, nn.Parameter]) -> torch.optim.Optimizer:
    """The same optimizer and hyper-parameters over the sharded parameters (fully_shard replaces them)."""
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        params = [sharded[names[id(param)]] for param in group["params"]]
        groups.append({**{key: value for key, value in group.items() if key != "params"}, "params": params})
    return type(optimizer)(groups)


@contextlib.contextmanager
def _without_gradient_sync(model) -> Iterator[None]:
    """FSDP2's no_sync: keep unsharded gradients, skip the reduce-scatter, until the last micro-step."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)

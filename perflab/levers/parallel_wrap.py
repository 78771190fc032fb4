"""Wrap a plan's model for data parallelism: DistributedDataParallel, or FSDP2's fully_shard per block.

Called by the data-parallel lever (perflab/levers/distributed.py) inside a rank, after the settings levers
have put the wrapper's options into `plan.parallel_options`.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn


def wrap_ddp(plan) -> None:
    """plan.model becomes DDP(plan.model) with the plan's bucket settings; no_sync skips the all-reduce."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [plan.device.index] if plan.device.type == "cuda" else None
    # FLOPs are counted on a replica without storage: a backward through the wrapped module outside DDP's forward
    # fires DDP's gradient hooks, and with static_graph=True that leaves its reducer silent for good (no all-reduce
    # ever again: perflab/distributed/replicas.py)
    plan.eager_model = meta_replica(plan.model)
    wrapped = DistributedDataParallel(plan.model, device_ids=device_ids, **plan.parallel_options)  # DDP's own names
    plan.model = wrapped
    plan.skip_gradient_sync = wrapped.no_sync


def meta_replica(model: nn.Module) -> Optional[nn.Module]:
    """A copy of `model` whose parameters and buffers live on the meta device (shapes, no storage), made without
    copying any weight (no second model on the GPU, even for a moment); None when the model cannot be deep-copied
    (its FLOPs are then not counted, which is all the replica is for)."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    try:
        return copy.deepcopy(model, memo)
    except Exception:  # noqa: BLE001 - a user's model holding something uncopyable (a lock, a handle)
        return None


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


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision_policy(param_dtype: Optional[str], reduce_dtype: Optional[str]):
    """FSDP2's MixedPrecisionPolicy, or None when neither dtype is set; bf16 parameters reduce in fp32 unless told
    otherwise (torchtitan's recipe: the gradient sum stays exact)."""
    if param_dtype is None and reduce_dtype is None:
        return None
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    if reduce_dtype is None and param_dtype is not None:
        reduce_dtype = "fp32"
    return MixedPrecisionPolicy(param_dtype=DTYPES.get(param_dtype), reduce_dtype=DTYPES.get(reduce_dtype))


def has_explicit_prefetch() -> bool:
    """FSDP2's set_modules_to_forward_prefetch / set_modules_to_backward_prefetch (torch >= 2.5)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return False
    return hasattr(FSDPModule, "set_modules_to_forward_prefetch")


def set_prefetch(blocks: list[nn.Module], depth: int) -> None:
    """Block i all-gathers blocks i+1..i+depth when its forward starts, and i-1..i-depth in its backward."""
    for index, block in enumerate(blocks):
        ahead = blocks[index + 1:index + 1 + depth]
        behind = blocks[max(0, index - depth):index][::-1]
        if ahead:
            block.set_modules_to_forward_prefetch(ahead)
        if behind:
            block.set_modules_to_backward_prefetch(behind)


def wrap_fsdp(plan) -> None:
    """fully_shard every block (compiled first with --fsdp-compile-blocks), then the root; the last N blocks keep
    their parameters after forward, explicit prefetch when asked; the optimizer is rebuilt over the shards."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fully_shard_function()
    settings = plan.parallel_options
    mesh = init_device_mesh(plan.device.type, (dist.get_world_size(),))
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": settings.get("reshard_after_forward", True)}
    policy = mixed_precision_policy(settings.get("param_dtype"), settings.get("reduce_dtype"))
    if policy is not None:
        options["mp_policy"] = policy
    names = {id(param): name for name, param in plan.model.named_parameters()}
    # FLOPs are counted on an unsharded replica without storage: a sharded model's forward all-gathers
    plan.eager_model = meta_replica(plan.model)
    blocks = list(shard_blocks(plan.model))
    keep_from = len(blocks) - settings.get("no_reshard_last", 0)
    for index, block in enumerate(blocks):
        if settings.get("compile_blocks"):
            block.compile()  # in place, before sharding: the hooks fully_shard adds stay outside the graph
        fully_shard(block, **{**options, "reshard_after_forward": False if index >= keep_from else
                              options["reshard_after_forward"]})
    fully_shard(plan.model, **options)
    if settings.get("prefetch"):
        set_prefetch(blocks, settings["prefetch"])
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

"""Data-parallel levers: the DDP / FSDP2 wrapper that --nproc ranks train through, and its settings.

Inside a rank (perflab/distributed/rank.py has started the process group), the settings levers put their
values into `plan.parallel_options` first; the data-parallel lever then wraps the model with them and
gives each rank its shard of the data; the compression hook goes on the wrapped model. Outside a rank
there is no process group, and the wrapper is refused with a reason.
"""
from __future__ import annotations

from typing import Optional

import torch.distributed as dist

from perflab.levers import Lever

COLLECTIVES = ("collectives",)


def _in_a_rank(cfg, workload, device) -> Optional[str]:
    if not (dist.is_available() and dist.is_initialized()):
        return (f"--nproc {cfg.nproc} runs in ranks that perflab starts: use `perflab run --nproc ...` or "
                "perflab.run(...), not build_plan directly")
    return None


def _apply_data_parallel(plan, cfg) -> None:
    from perflab.distributed.wrap import wrap_ddp, wrap_fsdp

    plan.data_shard = (dist.get_rank(), dist.get_world_size())
    if cfg.parallel == "fsdp":
        wrap_fsdp(plan)
    elif plan.mode == "train":
        wrap_ddp(plan)
    else:
        plan.notes.append("inference: each rank runs a full replica on its shard of the data (DDP only acts "
                          "on gradients)")


def _set(option: str, field: str):
    def apply(plan, cfg) -> None:
        plan.parallel_options[option] = getattr(cfg, field)
    return apply


def _apply_grad_accum(plan, cfg) -> None:
    plan.grad_accum = cfg.grad_accum


def _apply_comm_hook(plan, cfg) -> None:
    from perflab.distributed.wrap import register_compression_hook
    register_compression_hook(plan, cfg.ddp_comm_hook)


LEVERS = [
    Lever("grad-accum", "grad_accum", None, "accumulate gradients over N steps; with --nproc the first N-1 skip "
          "the all-reduce (no_sync)", "--mode train", COLLECTIVES, 44, _apply_grad_accum),
    Lever("ddp-bucket-size", "ddp_bucket_mb", None, "DDP gradient bucket size: when all-reduces start in backward "
          "and how many there are", "--nproc 2+, --parallel ddp, --mode train", COLLECTIVES, 44,
          _set("bucket_cap_mb", "ddp_bucket_mb")),
    Lever("gradient-as-bucket-view", "gradient_as_bucket_view", True, "gradients live in DDP's buckets: no copy, "
          "less memory", "--nproc 2+, --parallel ddp, --mode train", COLLECTIVES, 44,
          _set("gradient_as_bucket_view", "gradient_as_bucket_view")),
    Lever("static-graph", "static_graph", True, "DDP knows the graph is fixed: bucket order from the first step, "
          "no unused-parameter search", "--nproc 2+, --parallel ddp, --mode train", COLLECTIVES, 44,
          _set("static_graph", "static_graph")),
    Lever("fsdp-no-reshard", "reshard_after_forward", False, "FSDP keeps the gathered parameters from forward "
          "to backward: one all-gather less per step, more memory", "--nproc 2+, --parallel fsdp", COLLECTIVES,
          44, _set("reshard_after_forward", "reshard_after_forward")),
    Lever("data-parallel", "nproc", None, "DDP or FSDP2 over --nproc ranks, each on its shard of the data",
          "ranks started by perflab (--nproc)", (), 46, _apply_data_parallel, _in_a_rank),
    Lever("bf16-comm-hook", "ddp_comm_hook", "bf16", "all-reduce gradients in bf16: half the bytes",
          "CUDA, --nproc 2+, --parallel ddp, --mode train", COLLECTIVES, 47, _apply_comm_hook),
    Lever("fp16-comm-hook", "ddp_comm_hook", "fp16", "all-reduce gradients in fp16: half the bytes",
          "CUDA, --nproc 2+, --parallel ddp, --mode train", COLLECTIVES, 47, _apply_comm_hook),
]

"""Data-parallel levers: the DDP / FSDP2 wrapper that --nproc ranks train through, and its settings.

Inside a rank (perflab/distributed/rank.py has started the process group), the settings levers put their
values into `plan.parallel_options` first; the data-parallel lever then wraps the model with them and
gives each rank its shard of the data; the compression hook goes on the wrapped model. Outside a rank
there is no process group, and the wrapper is refused with a reason.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from perflab.bottlenecks import COLLECTIVES, COMPUTE_BOUND, DDP, FSDP, LAUNCH_OVERHEAD
from perflab.levers import COMPILES, ONE_TRIAL, Address, Lever, TuneHints
from perflab.levers.parallel_wrap import has_explicit_prefetch, register_compression_hook, wrap_ddp, wrap_fsdp


def _in_a_rank(cfg, workload, device) -> Optional[str]:
    if not (dist.is_available() and dist.is_initialized()):
        return (f"--nproc {cfg.nproc} runs in ranks that perflab starts: use `perflab run --nproc ...` or "
                "perflab.run(...), not build_plan directly")
    return None


def _apply_data_parallel(plan, cfg) -> None:

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


def _prefetch_exists(cfg, workload, device) -> Optional[str]:
    if not has_explicit_prefetch():
        return ("explicit FSDP prefetch (set_modules_to_forward_prefetch) needs torch 2.5 or later; this is torch "
                f"{torch.__version__.split('+')[0]}: drop --fsdp-prefetch (FSDP still prefetches one block itself)")
    return None


def _compile_warms_up(cfg, workload, device) -> Optional[str]:
    if cfg.warmup < 2:
        return "compilation must stay out of the numbers: use --warmup 2 or more"
    return None


def _apply_grad_accum(plan, cfg) -> None:
    plan.grad_accum = cfg.grad_accum


def _apply_comm_hook(plan, cfg) -> None:
    register_compression_hook(plan, cfg.ddp_comm_hook)


# The collectives rule names the DDP settings under DDP and the FSDP one under FSDP; grad-accum under both.
# What tune tries for the numeric settings (the bucket size in MiB around DDP's 25; prefetch depths in blocks)
DDP_BUCKET_MB = (5.0, 50.0, 100.0)
FSDP_PREFETCH_DEPTHS = (1, 2)
MORE_COMPUTE_PER_ALL_REDUCE = "more compute per all-reduce (a larger per-GPU batch, --grad-accum N)"

LEVERS = [
    Lever("grad-accum", "grad_accum", None, "accumulate gradients over N steps; with --nproc the first N-1 skip "
          "the all-reduce (no_sync)", "--mode train", (Address(COLLECTIVES, 4),), 44, _apply_grad_accum,
          in_code="optimizer.step() every N micro-batches, the first N-1 backwards inside ddp_model.no_sync()",
          when_lost="gradient accumulation lost: the number of all-reduces is not the cost; overlap them (bucket "
                    "size) or send fewer bytes (bf16 compression hook)",
          tune=TuneHints(ONE_TRIAL)),
    Lever("ddp-bucket-size", "ddp_bucket_mb", None, "DDP gradient bucket size: when all-reduces start in backward "
          "and how many there are", "--nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES, 1, DDP),), 44,
          _set("bucket_cap_mb", "ddp_bucket_mb"),
          in_code="DistributedDataParallel(model, bucket_cap_mb=N)",
          when_lost="another bucket size lost: the all-reduces overlap backward as well as they can; send fewer "
                    f"bytes (bf16 compression hook) or {MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL, values=DDP_BUCKET_MB)),
    Lever("gradient-as-bucket-view", "gradient_as_bucket_view", True, "gradients live in DDP's buckets: no copy, "
          "less memory", "--nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES, 2, DDP),), 44,
          _set("gradient_as_bucket_view", "gradient_as_bucket_view"),
          in_code="DistributedDataParallel(model, gradient_as_bucket_view=True)",
          when_lost="gradients as bucket views lost: the copy into the buckets is not the cost; the all-reduce "
                    f"is: {MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL)),
    Lever("static-graph", "static_graph", True, "DDP knows the graph is fixed: bucket order from the first step, "
          "no unused-parameter search", "--nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES, 3, DDP),),
          44, _set("static_graph", "static_graph"),
          in_code="DistributedDataParallel(model, static_graph=True)",
          when_lost="a static graph lost: the bucket order is not the cost; the all-reduce is: "
                    f"{MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fsdp-no-reshard", "reshard_after_forward", False, "FSDP keeps the gathered parameters from forward "
          "to backward: one all-gather less per step, more memory", "--nproc 2+, --parallel fsdp",
          (Address(COLLECTIVES, 5, FSDP),), 44, _set("reshard_after_forward", "reshard_after_forward"),
          in_code="fully_shard(module, reshard_after_forward=False)",
          when_lost="keeping the gathered parameters lost: the backward all-gathers were hidden already; "
                    f"{MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL)),
    Lever("no-broadcast-buffers", "broadcast_buffers", False, "DDP skips copying rank 0's buffers to every rank "
          "before each forward: one collective less per step (each rank keeps its own BatchNorm statistics)",
          "--nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES, 6, DDP),), 44,
          _set("broadcast_buffers", "broadcast_buffers"),
          in_code="DistributedDataParallel(model, broadcast_buffers=False)",
          when_lost="skipping the buffer broadcast lost: the model has few or no buffers; the gradient all-reduce "
                    "is the cost: bucket size, or the bf16 compression hook",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fsdp-prefetch", "fsdp_prefetch", None, "FSDP2 issues the next blocks' all-gathers ahead (forward) and the "
          "previous blocks' (backward), so they run under the current block's compute",
          "--nproc 2+, --parallel fsdp, torch 2.5+", (Address(COLLECTIVES, 1, FSDP),), 44, _set("prefetch", "fsdp_prefetch"),
          in_code="block.set_modules_to_forward_prefetch(next_blocks); block.set_modules_to_backward_prefetch("
                  "previous_blocks) on each fully_shard-ed block",
          when_lost="explicit prefetch lost: one block's compute is shorter than the next block's all-gather; send "
                    "fewer bytes (--fsdp-param-dtype bf16) or more compute per block (a larger batch)",
          tune=TuneHints(ONE_TRIAL, values=FSDP_PREFETCH_DEPTHS), checks=_prefetch_exists),
    Lever("fsdp-no-reshard-last", "fsdp_no_reshard_last", None, "FSDP keeps the last blocks' gathered parameters "
          "after forward: backward starts with them, so it does not wait for their all-gather again",
          "--nproc 2+, --parallel fsdp", (Address(COLLECTIVES, 2, FSDP),), 44,
          _set("no_reshard_last", "fsdp_no_reshard_last"),
          in_code="fully_shard(blocks[-1], reshard_after_forward=False) (the other blocks keep True)",
          when_lost="keeping the last blocks gathered lost: their all-gather was hidden already; prefetch "
                    "(--fsdp-prefetch) or fewer bytes (--fsdp-param-dtype bf16)",
          tune=TuneHints(ONE_TRIAL, values=(1,))),
    Lever("fsdp-bf16-reduce", "fsdp_reduce_dtype", "bf16", "FSDP2 reduce-scatters gradients in bf16: half the bytes",
          "--nproc 2+, --parallel fsdp", (Address(COLLECTIVES, 3, FSDP),), 44, _set("reduce_dtype", "fsdp_reduce_dtype"),
          in_code="fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                  "reduce_dtype=torch.bfloat16))",
          when_lost="the bf16 reduce-scatter lost: the gradient bytes are not the exposed part; the all-gathers "
                    "are: prefetch (--fsdp-prefetch) or bf16 parameters",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fsdp-bf16-params", "fsdp_param_dtype", "bf16", "FSDP2 all-gathers parameters in bf16 and computes in "
          "bf16 (MixedPrecisionPolicy): half the all-gather bytes, fp32 master shards",
          "--nproc 2+, --parallel fsdp", (Address(COLLECTIVES, 4, FSDP),), 44, _set("param_dtype", "fsdp_param_dtype"),
          in_code="fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                  "reduce_dtype=torch.float32))",
          when_lost="bf16 parameters lost: the all-gathers were hidden; the reduce-scatter or the host's hooks are "
                    "left: bf16 reduce, per-block compile",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fsdp-compile-blocks", "fsdp_compile_blocks", True, "compile each block before sharding (torchtitan): "
          "each block's kernels fused, FSDP's hooks between blocks stay eager",
          "--nproc 2+, --parallel fsdp, a C++ compiler (CPU) or Triton (CUDA)",
          (Address(COLLECTIVES, 6, FSDP), Address(LAUNCH_OVERHEAD)), 44, _set("compile_blocks", "fsdp_compile_blocks"),
          in_code="for block in model.blocks: block.compile(); fully_shard(block)  # then fully_shard(model)",
          when_lost="per-block compile lost: the blocks' kernels were not the cost; the communication is: prefetch, "
                    "bf16 parameters",
          tune=TuneHints(COMPILES), checks=_compile_warms_up),
    # Not named by any rule (--nproc is the user's choice of hardware); tune expands no value for it.
    Lever("data-parallel", "nproc", None, "DDP or FSDP2 over --nproc ranks, each on its shard of the data",
          "ranks started by perflab (--nproc)", (Address(COMPUTE_BOUND),), 46, _apply_data_parallel,
          in_code="torchrun --nproc-per-node N script.py, with DistributedDataParallel(model) (or fully_shard) "
                  "and a DistributedSampler",
          when_lost="more ranks lost: communication costs what the split compute saved; the collectives levers, "
                    f"or {MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL), checks=_in_a_rank, changes_process=True),
    Lever("bf16-comm-hook", "ddp_comm_hook", "bf16", "all-reduce gradients in bf16: half the bytes",
          "CUDA, --nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES, 5, DDP),), 47, _apply_comm_hook,
          in_code="ddp_model.register_comm_hook(None, default_hooks.bf16_compress_hook) "
                  "(torch.distributed.algorithms.ddp_comm_hooks)",
          when_lost="bf16 gradient compression lost: the bytes are not the limit, the exposed latency is: larger "
                    f"buckets, or {MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fp16-comm-hook", "ddp_comm_hook", "fp16", "all-reduce gradients in fp16: half the bytes",
          "CUDA, --nproc 2+, --parallel ddp, --mode train", (Address(COLLECTIVES),), 47, _apply_comm_hook,
          in_code="ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook) "
                  "(torch.distributed.algorithms.ddp_comm_hooks)",
          when_lost="fp16 gradient compression lost: the bytes are not the limit, the exposed latency is: larger "
                    f"buckets, or {MORE_COMPUTE_PER_ALL_REDUCE}",
          tune=TuneHints(ONE_TRIAL)),
]

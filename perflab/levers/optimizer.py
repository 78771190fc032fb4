"""--optimizer-impl foreach|fused: multi-tensor or fused optimizer kernels instead of a per-parameter loop;
--optimizer-impl 8bit: torchao's 8-bit Adam/AdamW, whose two moments take about a quarter of the memory.

torchao (an optional extra, imported only when the lever runs) quantizes a moment in blocks of EIGHT_BIT_BLOCK
values, one byte each plus one fp32 scale per block, and only for tensors of at least EIGHT_BIT_MIN_NUMEL values
that split into whole blocks; smaller ones stay fp32 (torchao.optim's `_new_buffer`, after bitsandbytes).
"""
from __future__ import annotations

import importlib.util
from typing import Optional

from perflab.errors import PerflabError
from perflab.bottlenecks import ACTIVATION_MEMORY, LAUNCH_OVERHEAD, SINGLE_TENSOR_UPDATES, TRAINING
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints


def rebuild_optimizer(optimizer, impl: str):
    """The same optimizer class and hyper-parameters with `foreach` or `fused` chosen."""
    groups = []
    for group in optimizer.param_groups:
        if "fused" not in group and "foreach" not in group:
            raise PerflabError(f"{type(optimizer).__name__} has no foreach/fused implementation; "
                               "drop --optimizer-impl")
        group = dict(group)
        group["foreach"] = impl == "foreach"
        if "fused" in group:
            group["fused"] = impl == "fused" or None
        groups.append(group)
    if impl == "fused" and "fused" not in optimizer.param_groups[0]:
        raise PerflabError(f"{type(optimizer).__name__} has no fused implementation in torch; "
                           "use --optimizer-impl foreach")
    try:
        return type(optimizer)(groups)  # a group's own keys override the class defaults
    except (RuntimeError, ValueError, TypeError) as err:
        raise PerflabError(f"--optimizer-impl {impl} is not available here: {err}") from None


def _apply(plan, cfg) -> None:
    plan.optimizer = rebuild_optimizer(plan.optimizer, cfg.optimizer_impl)


EIGHT_BIT_BLOCK = 256  # torchao.optim's default block size for its 8-bit optimizers
EIGHT_BIT_MIN_NUMEL = 4096  # smaller state tensors stay fp32
TORCHAO_INSTALL = "pip install torchao"


def eight_bit_state_bytes(numel: int, element_size: int = 4) -> float:
    """The bytes one optimizer-state tensor of `numel` values takes under torchao's 8-bit optimizer."""
    if numel >= EIGHT_BIT_MIN_NUMEL and numel % EIGHT_BIT_BLOCK == 0:
        return numel * (1 + 4 / EIGHT_BIT_BLOCK)  # a byte per value, an fp32 scale per block
    return float(numel * element_size)


def _torchao_missing(cfg, workload, device) -> Optional[str]:
    if importlib.util.find_spec("torchao") is None:
        return f"torchao is not installed: {TORCHAO_INSTALL}"
    return None


def eight_bit_optimizer(optimizer):
    """torchao's 8-bit twin of an Adam or AdamW optimizer, with the same parameter groups and hyper-parameters."""
    name = type(optimizer).__name__
    if name not in ("Adam", "AdamW"):
        raise PerflabError(f"--optimizer-impl 8bit replaces Adam or AdamW; this workload's optimizer is {name}")
    try:
        from torchao import optim as low_bit  # torchao >= 0.11
    except ImportError:
        from torchao.prototype import low_bit_optim as low_bit  # older torchao
    keys = ("params", "lr", "betas", "eps", "weight_decay")
    groups = [{key: group[key] for key in keys if key in group} for group in optimizer.param_groups]
    return getattr(low_bit, f"{name}8bit")(groups, block_size=EIGHT_BIT_BLOCK)


def _apply_8bit(plan, cfg) -> None:
    plan.optimizer = eight_bit_optimizer(plan.optimizer)
    plan.notes.append("8-bit optimizer: torchao's " + type(plan.optimizer).__name__ + " keeps Adam's moments in 8 "
                      "bits with a scale per block of 256 (about a quarter of the fp32 state)")


LEVERS = [
    Lever("foreach-optimizer", "optimizer_impl", "foreach", "multi-tensor (foreach) optimizer step",
          "--mode train",
          (Address(LAUNCH_OVERHEAD, 4, TRAINING), Address(LAUNCH_OVERHEAD, 2, SINGLE_TENSOR_UPDATES)), 40, _apply,
          in_code="the optimizer with foreach=True",
          when_lost="the foreach optimizer lost: the optimizer step is not the cost",
          tune=TuneHints(ONE_TRIAL)),
    Lever("fused-optimizer", "optimizer_impl", "fused", "one fused kernel per optimizer step",
          "--mode train; an optimizer with a fused implementation",
          (Address(LAUNCH_OVERHEAD, 3, TRAINING), Address(LAUNCH_OVERHEAD, 1, SINGLE_TENSOR_UPDATES)), 40,
          _apply,
          in_code="the optimizer with fused=True (Adam, AdamW, SGD on CUDA)",
          when_lost="the fused optimizer lost: the optimizer step is not the cost",
          tune=TuneHints(ONE_TRIAL)),
    Lever("8bit-optimizer", "optimizer_impl", "8bit",
          "Adam's two moments in 8 bits with block scales (torchao): about a quarter of the optimizer state",
          "--mode train; an Adam or AdamW optimizer; torchao (pip install torchao)", (Address(ACTIVATION_MEMORY),),
          40, _apply_8bit,
          in_code="torchao.optim.AdamW8bit(model.parameters(), ...) in place of torch.optim.AdamW",
          when_lost="the 8-bit optimizer lost: the optimizer state is not what fills the memory; activation "
                    "checkpointing or bf16 frees the activations",
          tune=TuneHints(ONE_TRIAL), checks=_torchao_missing),
]

"""What each memory lever would free, computed from the breakdown, and the batch each would then allow.

A lever scales categories of the step's memory timeline (activations x 0.5 for bf16, optimizer state x ~0.26 for
an 8-bit optimizer, model states / N for FSDP ...); its predicted peak at the step's batch is the new timeline's
highest point, so a lever that shrinks memory which is not alive at the peak frees nothing. Its line over batch
(`fixed_mb + per_sample_mb x batch`, what it frees at a larger batch and the batch it would allow) is the category
model's (perflab/memory/fit.py) with the model states it frees taken off the fixed part, the weight copies it adds
put on it, and the per-sample part scaled as the growing categories are where they are highest.
"""
from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Any, Optional

from perflab.config import is_full_precision
from perflab.levers.optimizer import EIGHT_BIT_BLOCK, EIGHT_BIT_MIN_NUMEL, TORCHAO_INSTALL, eight_bit_state_bytes
from perflab.memory.breakdown import Breakdown
from perflab.memory.fit import GROWING, PeakFit, category_fit, growing_moment, largest_batch
from perflab.memory.timeline import CATEGORIES, MODEL_STATES

EIGHT_BIT_STATE = eight_bit_state_bytes(EIGHT_BIT_MIN_NUMEL) / (4 * EIGHT_BIT_MIN_NUMEL)  # (1 + 4/256) / 4
AUTOCAST_SHARE = 0.5  # without a counted forward under autocast: every activation assumed in 2 bytes instead of 4
LOSS_TENSORS = 3  # the output as an fp32 loss takes it, the loss's own intermediate, and the output's gradient
SLACK_SHARE = 0.1  # slack beyond this share of reserved memory makes expandable_segments worth naming


@dataclass
class LeverSaving:
    """One lever: the peak it predicts at this batch, what it frees, the batch it would allow, and why."""

    lever: str
    how: str  # the flag or setting
    predicted_peak_mb: Optional[float]
    frees_mb: Optional[float]
    batch_allowed: Optional[int]
    basis: str  # what the estimate assumes
    note: str = ""
    fixed_mb: Optional[float] = None  # the peak with the lever on: fixed_mb + per_sample_mb x batch
    per_sample_mb: Optional[float] = None

    def predict_mb(self, batch: int) -> Optional[float]:
        """The peak predicted at `batch` with the lever on (None where the lever does not move the line)."""
        return None if self.fixed_mb is None else self.fixed_mb + self.per_sample_mb * batch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peak_with(breakdown: Breakdown, factors: dict[str, float], with_activations_mb: float = 0.0) -> float:
    """The highest point of the step's timeline with categories scaled by `factors`, plus `with_activations_mb` of
    weight copies: alive while activations are, each freed when backward makes its weight's gradient (so in the
    share of the gradients not made yet)."""
    timeline = breakdown.category_timeline()
    if timeline is None:
        peak = sum(factors.get(name, 1.0) * mb for name, mb in breakdown.categories_mb.items()) + with_activations_mb
    else:
        activations = timeline.mb.get("activations") or [0.0] * len(timeline.times_ms)
        gradients = timeline.mb.get("gradients") or [0.0] * len(timeline.times_ms)
        most, most_gradients = max(activations, default=0.0), max(gradients, default=0.0)
        alive = [(1.0 - grad / most_gradients if most_gradients > 0 else 1.0) if act > 0.01 * most else 0.0
                 for act, grad in zip(activations, gradients)]
        peak = max(total + with_activations_mb * share for total, share in zip(timeline.totals(factors), alive))
    return peak + breakdown.unattributed_mb


def _line_with(breakdown: Breakdown, fit: Optional[PeakFit], factors: dict[str, float],
               extra_fixed_mb: float) -> tuple[float, float]:
    """The lever's line: the model states it changes and the weight copies it adds on the fixed part; the
    per-sample part scaled as the growing categories are at their highest moment (where a large batch peaks)."""
    fixed, per_sample = _fit_parts(breakdown, fit)
    moment = growing_moment(breakdown)
    growing = sum(moment.get(name, 0.0) for name in GROWING)
    share = (sum(factors.get(name, 1.0) * moment.get(name, 0.0) for name in GROWING) / growing) if growing > 0 else 1.0
    states_change = sum((factors.get(name, 1.0) - 1.0) * moment.get(name, 0.0) for name in MODEL_STATES)
    return fixed + states_change + extra_fixed_mb, max(1e-9, per_sample * share)


def _saving(breakdown: Breakdown, fit: Optional[PeakFit], capacity_mb: Optional[float], lever: str, how: str,
            factors: dict[str, float], basis: str, extra_fixed_mb: float = 0.0, note: str = "") -> LeverSaving:
    peak = _peak_with(breakdown, factors, extra_fixed_mb)
    new_fixed, new_per_sample = _line_with(breakdown, fit, factors, extra_fixed_mb)
    return LeverSaving(lever, how, peak, breakdown.peak_mb - peak, largest_batch(new_fixed, new_per_sample, capacity_mb),
                       basis, note, new_fixed, new_per_sample)


def _fit_parts(breakdown: Breakdown, fit: Optional[PeakFit]) -> tuple[float, float]:
    """The fixed and per-sample parts: the fit's, else the category model of this one step."""
    model = fit if fit is not None else category_fit([breakdown])
    return model.fixed_mb, model.per_sample_mb


def lever_savings(breakdown: Breakdown, fit: Optional[PeakFit], capacity_mb: Optional[float],
                  shards: int = 8, checkpointing_supported: Optional[bool] = None) -> list[LeverSaving]:
    """The memory levers that apply to this step, each with what it would free and the batch it would allow."""
    train = breakdown.mode == "train"
    savings: list[LeverSaving] = []
    activations = breakdown.activations
    checkpointed = activations.checkpointed_mb(breakdown.categories_mb.get("temporaries", 0.0))
    if train and checkpointed is not None and activations.total_mb > 0:
        note = "" if checkpointing_supported is not False else (
            "this workload declares no checkpointable blocks: wrap its blocks in torch.utils.checkpoint")
        savings.append(_saving(
            breakdown, fit, capacity_mb, "activation checkpointing", "--activation-checkpointing",
            {"activations": checkpointed / activations.total_mb},
            f"per block of {activations.blocks or 'the model'} ({len(activations.block_saved_mb)} blocks): keeps each "
            "block's input, recomputes one block at a time in backward", note=note))
    if is_full_precision(breakdown.precision):
        savings.append(_autocast_saving(breakdown, fit, capacity_mb))
        savings.append(_saving(breakdown, fit, capacity_mb, "bf16 weights", "model.to(torch.bfloat16)",
                               {name: 0.5 for name in CATEGORIES if name != "inputs"},
                               "every tensor of the step in 2 bytes (pure bf16 training; check convergence)"))
    if train and breakdown.categories_mb.get("optimizer_state", 0.0) > 0 and breakdown.optimizer in ("Adam", "AdamW"):
        savings.append(_eight_bit_saving(breakdown, fit, capacity_mb))
    if train:
        savings.append(_saving(breakdown, fit, capacity_mb, f"FSDP over {shards} GPUs", f"--nproc {shards} "
                               "--parallel fsdp", {name: 1.0 / shards for name in MODEL_STATES},
                               f"parameters, gradients and optimizer state sharded {shards} ways (one block "
                               "unsharded at a time is not counted)"))
        savings.append(LeverSaving("gradients set to None", "optimizer.zero_grad(set_to_none=True)",
                                   breakdown.peak_mb, 0.0, None, "perflab's step already frees gradients after the "
                                   "optimizer step", note=f"a loop that zeroes them in place keeps "
                                   f"{breakdown.categories_mb.get('gradients', 0.0) or _gradients_mb(breakdown):.0f} MiB "
                                   "alive through forward"))
    slack = breakdown.slack_mb
    if slack is not None and breakdown.reserved_mb and slack > SLACK_SHARE * breakdown.reserved_mb:
        fixed, per_sample = _fit_parts(breakdown, fit)
        capacity = capacity_mb + slack if capacity_mb is not None else None
        savings.append(LeverSaving("expandable_segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                   breakdown.peak_mb, slack, largest_batch(fixed, per_sample, capacity),
                                   "the reserved-but-unallocated slack returned (fragmentation)",
                                   note="frees reserved memory, not allocated"))
    return savings


def _autocast_saving(breakdown: Breakdown, fit: Optional[PeakFit], capacity_mb: Optional[float]) -> LeverSaving:
    """bf16 autocast keeps fp32 parameters, gradients and optimizer state; it saves in bf16 only what its bf16 ops
    (matmuls, convolutions) take, while normalisations, softmax and the residual stream stay fp32, and it keeps a
    bf16 copy of each weight those ops use until backward. The figures come from one forward under autocast when
    the step had one (perflab/memory/step.py), else half the activations and a bf16 copy of every weight.

    The temporaries at the peak: up to LOSS_TENSORS times the model's output are the loss's and the output's
    gradient, which autocast computes in fp32 (unchanged); the rest are gradients of activations, in their dtype."""
    if breakdown.autocast_step is not None:
        return _measured_autocast_saving(breakdown, fit, capacity_mb)
    full_mb = breakdown.activations.total_mb or 0.0
    under = breakdown.autocast_activations
    temporaries_mb = breakdown.categories_mb.get("temporaries", 0.0)
    if under is not None and full_mb > 0:
        share = under.total_mb / full_mb
        copies_mb = under.parameter_copies_mb
        loss_mb = min(temporaries_mb, LOSS_TENSORS * under.output_fp32_mb)
        temporaries_share = (loss_mb + share * (temporaries_mb - loss_mb)) / temporaries_mb if temporaries_mb else 1.0
        dtypes = ", ".join(f"{name} {mb:,.1f}" for name, mb in sorted((under.by_dtype_mb or {}).items()))
        basis = (f"counted in one forward under bf16 autocast: the activations saved for backward x {share:.2f} "
                 f"({dtypes} MiB), temporaries x {temporaries_share:.2f} (the loss stays fp32), plus "
                 f"{copies_mb:,.1f} MiB of bf16 weight copies kept until backward")
    else:
        share = temporaries_share = AUTOCAST_SHARE
        copies_mb = 0.5 * breakdown.categories_mb.get("parameters", 0.0)
        basis = ("assumed (no forward under autocast was counted): activations and temporaries in 2 bytes, plus the "
                 "bf16 copies of the weights autocast keeps during forward")
    return _saving(breakdown, fit, capacity_mb, "bf16 autocast", "--precision bf16",
                   {"activations": share, "temporaries": temporaries_share}, basis, extra_fixed_mb=copies_mb)


def _measured_autocast_saving(breakdown: Breakdown, fit: Optional[PeakFit],
                              capacity_mb: Optional[float]) -> LeverSaving:
    """bf16 autocast where the device emulates bf16: the peak of a step measured under it, and its line from the
    categories' measured ratios (temporaries may grow: backward's conversions to fp32)."""
    step = breakdown.autocast_step
    factors = {name: step.categories_mb.get(name, 0.0) / mb
               for name, mb in breakdown.categories_mb.items() if mb > 0}
    changed = ", ".join(f"{name} x {factors[name]:.2f}" for name in ("activations", "temporaries") if name in factors)
    basis = f"measured: one step under bf16 autocast ({changed}), since {step.why}"
    fixed, per_sample = _line_with(breakdown, fit, factors, 0.0)
    peak = step.peak_mb
    return LeverSaving("bf16 autocast", "--precision bf16", peak, breakdown.peak_mb - peak,
                       largest_batch(fixed, per_sample, capacity_mb), basis, "", fixed, per_sample)


def _eight_bit_saving(breakdown: Breakdown, fit: Optional[PeakFit], capacity_mb: Optional[float]) -> LeverSaving:
    """torchao's 8-bit Adam: the optimizer state as it would hold it, tensor by tensor (a byte per value and a
    scale per block; small tensors stay fp32), else every moment at EIGHT_BIT_STATE of its fp32 size."""
    share = breakdown.optimizer_state_8bit_share
    share = EIGHT_BIT_STATE if share is None else share
    have = importlib.util.find_spec("torchao") is not None
    return _saving(breakdown, fit, capacity_mb, "8-bit optimizer state", "--optimizer-impl 8bit",
                   {"optimizer_state": share},
                   f"Adam's two moments in 8 bits with an fp32 scale per block of {EIGHT_BIT_BLOCK} "
                   f"(optimizer state x {share:.3f}; tensors under {EIGHT_BIT_MIN_NUMEL} values stay fp32)",
                   note="" if have else f"torchao is not installed: {TORCHAO_INSTALL}")


def _gradients_mb(breakdown: Breakdown) -> float:
    timeline = breakdown.category_timeline()
    return max(timeline.mb["gradients"]) if timeline is not None else 0.0

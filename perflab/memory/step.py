"""One training or inference step profiled for memory: the measured peak, its categories, the saved activations.

    breakdown = measure_step(cfg)                       # one warm step, then the measured one
    breakdown = measure_step(cfg, snapshot=path)         # CUDA: also the allocator snapshot for memory_viz

The step is the harness's own (perflab/harness/loop.py), with the run's levers. The first step makes the
optimizer's state and warms the allocator; the second is measured: on CUDA the peak is
torch.cuda.max_memory_allocated, on the CPU the allocator's running total in the profiler's allocation events
over what was alive when it began. A memory limit (--memory-limit-mb, PERFLAB_MEMORY_LIMIT_MB) turns a peak
over it into an out-of-memory, so the batch search can be tested without a GPU.
"""
from __future__ import annotations

import gc
import math
import os
from pathlib import Path
from typing import Optional

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from perflab.backends import bf16_is_native, cpu_capability
from perflab.config import RunConfig
from perflab.step.calls import check_first_loss
from perflab.harness.loop import run_steps
from perflab.step.timers import NullTimer
from perflab.levers.optimizer import eight_bit_state_bytes
from perflab.errors import PerflabError, is_out_of_memory
from perflab.memory.activations import ActivationAccounting, SavedActivations, saved_under_autocast
from perflab.memory.breakdown import AutocastStep, Breakdown, count_saved_activations
from perflab.memory.timeline import CATEGORIES, allocator_increase_mb, category_timeline, profiler_options
from perflab.prepare import load, prepared, resolve_config, resolve_device

LIMIT_ENV = "PERFLAB_MEMORY_LIMIT_MB"


def memory_limit_mb(option: Optional[float] = None) -> Optional[float]:
    """--memory-limit-mb, else PERFLAB_MEMORY_LIMIT_MB, else None (the device's own memory is the limit)."""
    if option:
        return float(option)
    value = os.environ.get(LIMIT_ENV, "").strip()
    if not value:
        return None
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if not math.isfinite(limit) or limit <= 0:
        raise PerflabError(f"{LIMIT_ENV} must be a positive finite number of MiB, got {value!r}; set it to e.g. "
                           f"40000 or unset it")
    return limit


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storages_mb(tensors) -> float:
    seen = {}
    for tensor in _plain_tensors(tensors):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()) / 2**20


def _plain_tensors(tensors):
    """The tensors, with a wrapper subclass (torchao's 8-bit optimizer state) replaced by the tensors it holds: a
    wrapper's own storage cannot be read."""
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            yield from _plain_tensors(getattr(tensor, name) for name in names)
        else:
            yield tensor


def _optimizer_state(optimizer) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)
            and value.dim() > 0]


def measure_step(config: RunConfig, snapshot: Optional[Path] = None, categorise: bool = True,
                 limit_mb: Optional[float] = None, count_autocast: bool = True) -> Breakdown:
    """Profile one step of `config` for memory; raise torch.OutOfMemoryError when the peak is over the limit."""
    cfg = resolve_config(config.replace(check_quality=False, out=None), None)
    device = resolve_device(cfg.device)
    limit_mb = memory_limit_mb(limit_mb)
    workload = load(None, cfg)
    with prepared(workload, cfg, device) as prep:
        plan = prep.plan
        batches = plan.batches(cfg.seed)
        with plan.stepping():
            check_first_loss(plan, next(batches))
            run_steps(plan, batches, 1, NullTimer())  # optimizer state made, allocator warm
            _synchronize(device)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                _record_history(snapshot)
            prof, saved = None, None
            if categorise or device.type == "cpu":  # the CPU's peak itself comes from the profiler's memory profile
                with torch.profiler.profile(**profiler_options()) as prof, \
                        ActivationAccounting(plan.eager_model) as saved:
                    run_steps(plan, batches, 1, NullTimer())
                    _synchronize(device)
            else:
                run_steps(plan, batches, 1, NullTimer())
                _synchronize(device)
            model_states = [*plan.eager_model.parameters(), *_optimizer_state(plan.optimizer)]
            model_states_mb = _storages_mb(model_states) + _storages_mb(p.grad for p in plan.eager_model.parameters())
            breakdown = _breakdown(cfg, device, plan, prof, saved, model_states_mb, snapshot)
            breakdown.optimizer_state_8bit_share = _eight_bit_share(plan.optimizer)
            if saved is not None and count_autocast:
                _count_autocast(plan, batches, device, breakdown)
    if count_autocast and breakdown.autocast_activations and not bf16_is_native(device):
        _measure_autocast_step(cfg, device, breakdown)
    if limit_mb is not None:
        breakdown.total_mb = limit_mb
        if breakdown.peak_mb > limit_mb:
            raise torch.OutOfMemoryError(
                f"out of memory under the memory limit ({LIMIT_ENV} or --memory-limit-mb): tried to allocate "
                f"{breakdown.peak_mb - limit_mb:.2f} MiB over it; the limit is a total capacity of {limit_mb:.2f} MiB "
                f"and the step's peak is {breakdown.peak_mb:.1f} MiB")
    return breakdown


def _eight_bit_share(optimizer) -> Optional[float]:
    """An Adam/AdamW's state under torchao's 8-bit optimizer over its size now, tensor by tensor; None for others
    (or before the state exists)."""
    if optimizer is None or type(optimizer).__name__ not in ("Adam", "AdamW"):
        return None
    state = {tensor.untyped_storage().data_ptr(): tensor for tensor in _optimizer_state(optimizer)}
    now = sum(t.numel() * t.element_size() for t in state.values())
    return sum(eight_bit_state_bytes(t.numel(), t.element_size()) for t in state.values()) / now if now else None


def _count_autocast(plan, batches, device: torch.device, breakdown: Breakdown) -> None:
    """A train step at full precision: what bf16 autocast would save for backward, from one more forward under it
    (after the measured step, so its peak is not the step's); an out-of-memory here only loses that figure."""
    if plan.mode != "train" or plan.autocast_dtype is not None or plan.custom_step is not None \
            or plan.step_fn is not None:
        return
    batch = next(batches) if plan.batches_on_device else plan.to_device(next(batches))
    inputs, _ = plan.gpu_transform(batch) if plan.gpu_transform is not None else batch
    try:
        breakdown.autocast_activations = saved_under_autocast(plan.eager_model, inputs, device)
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        breakdown.notes.append("the forward under bf16 autocast ran out of memory: the bf16 estimate assumes half "
                               "the activations")
    finally:
        gc.collect()


def _measure_autocast_step(cfg: RunConfig, device: torch.device, breakdown: Breakdown) -> None:
    """Where bf16 is emulated (an AVX2-only CPU: oneDNN converts each bf16 op's operands to fp32 and back), the
    forward's count says what is saved but not what backward's conversions add: one step under bf16 autocast is
    measured instead, so the saving is this device's, not an ideal one."""
    why = (f"bf16 is not native here ({device.type}, {cpu_capability()}: oneDNN has no bf16 instructions and "
           "converts to fp32 and back)" if device.type == "cpu" else f"bf16 is not native on {device}")
    try:
        under = measure_step(cfg.replace(precision="bf16"), count_autocast=False)
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        breakdown.notes.append(f"{why}; the step under bf16 autocast ran out of memory, so its saving is estimated "
                               "from one forward")
        return
    finally:
        gc.collect()
    breakdown.autocast_step = AutocastStep(under.peak_mb, dict(under.categories_mb), why)


def _record_history(snapshot: Optional[Path]) -> None:
    if snapshot is None:
        return
    try:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    except Exception:  # private API: no snapshot rather than no breakdown
        pass


def _dump_history(snapshot: Optional[Path], notes: list[str]) -> None:
    if snapshot is None:
        return
    try:
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as err:
        notes.append(f"no memory snapshot: {type(err).__name__}: {err}")


def _breakdown(cfg: RunConfig, device: torch.device, plan, prof, saved, model_states_mb: float,
               snapshot: Optional[Path]) -> Breakdown:
    notes: list[str] = []
    reserved_mb = total_mb = None
    timeline, how = category_timeline(prof, device) if prof is not None and saved is not None else (None, "")
    if device.type == "cuda":
        _dump_history(snapshot, notes)
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
        peak_source = "torch.cuda.max_memory_allocated over the measured step"
        reserved_mb = torch.cuda.max_memory_reserved(device) / 2**20
        total_mb = torch.cuda.get_device_properties(device).total_memory / 2**20
    else:
        increase = allocator_increase_mb(prof) if prof is not None else None
        alive_mb = sum(timeline.at(0).values()) if timeline is not None else model_states_mb
        peak_mb = alive_mb + (increase or 0.0)
        peak_source = ("the CPU allocator's running total (profiler allocation events) over what was alive when the "
                       "step began")
        if increase is None:
            notes.append("the profiler's allocation events could not be read: the CPU peak is the model states only")
    if timeline is not None:
        categories = timeline.at(timeline.peak_index())
    else:
        categories = _own_accounting(plan, saved, model_states_mb, peak_mb)
        how = "perflab's own accounting (saved-tensor hooks; model, gradient and optimizer sizes)" + (
            f"; {how}" if how else "")
    breakdown = Breakdown(workload=cfg.workload, mode=cfg.mode, device=str(device), batch_size=cfg.batch_size,
                          precision=cfg.precision, peak_mb=peak_mb, peak_source=peak_source,
                          categories_mb={name: categories.get(name, 0.0) for name in CATEGORIES}, source=how,
                          reserved_mb=reserved_mb, total_mb=total_mb,
                          activations=saved.result if saved is not None else SavedActivations(),
                          timeline=timeline,
                          optimizer=type(plan.optimizer).__name__ if plan.optimizer is not None else None, notes=notes)
    count_saved_activations(breakdown)
    return breakdown


def _own_accounting(plan, saved, model_states_mb: float, peak_mb: float) -> dict[str, float]:
    """Without the profiler's categories: the model's sizes, the saved activations, and the rest as temporaries. A
    step's peak is either at the end of forward (activations alive, no gradients yet: perflab's step sets them to
    None) or in the optimizer step (gradients alive, activations freed): the larger of the two is taken."""
    params_mb = _storages_mb(plan.eager_model.parameters())
    optimizer_mb = _storages_mb(_optimizer_state(plan.optimizer))
    train = plan.mode == "train"
    gradients_mb = _storages_mb(p for p in plan.eager_model.parameters() if p.requires_grad) if train else 0.0
    activations_mb = saved.result.total_mb if saved is not None else 0.0
    if gradients_mb > activations_mb:
        activations_mb = 0.0
    else:
        gradients_mb = 0.0
    known = params_mb + optimizer_mb + gradients_mb + activations_mb
    return {"parameters": params_mb, "gradients": gradients_mb, "optimizer_state": optimizer_mb,
            "activations": activations_mb, "inputs": 0.0, "temporaries": max(0.0, peak_mb - known)}

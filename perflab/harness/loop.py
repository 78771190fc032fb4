"""The timed loop: one step = data wait, host-to-device copy, [augment], forward, [backward, optimizer].

It stays lean: no logging, no host syncs, no allocations beyond the workload's own. The timer and the
markers are the only instrumentation, and both record without synchronising.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from perflab.step.calls import call_loss, call_model
from perflab.step.phases import marker_name
from perflab.step.plan import StepPlan
from perflab.profile.markers import phase_marker


def run_steps(plan: StepPlan, batches: Iterator[Any], steps: int, timer,
              on_step: Optional[Callable[[], None]] = None) -> None:
    """Run `steps` steps, recording phases on `timer`; the caller synchronises around it."""
    train = plan.mode == "train"
    mark = phase_marker(plan.markers)
    for _ in range(steps):
        timer.step_start()
        with timer.host_phase("data_wait"), mark(marker_name("data_wait")):
            batch = next(batches)
        if not plan.batches_on_device:
            with timer.phase("h2d"), mark("h2d"):
                batch = plan.to_device(batch)
        if plan.gpu_transform is not None:
            with timer.phase("augment"), mark("augment"):
                batch = plan.gpu_transform(batch)
        if plan.custom_step is not None:
            plan.custom_step(plan, batch, timer, mark)
        elif plan.step_fn is not None:
            with timer.phase("step"), mark("step"):
                plan.step_fn(batch)
        elif train:
            train_step(plan, batch, timer, mark)
        else:
            infer_step(plan, batch, timer, mark)
        if on_step is not None:
            on_step()
    timer.finish()


def train_step(plan: StepPlan, batch: Any, timer, mark: type) -> None:
    inputs, target = batch
    accumulating = plan.grad_accum > 1 and plan.accumulating()
    with plan.gradient_sync(accumulating):
        with timer.phase("forward"), mark("forward"), plan.autocast():
            loss = call_loss(plan.loss_fn, call_model(plan.model, inputs), target)
        plan.last_value = loss  # kept, not read: checked for NaN/inf once after the trial
        # accumulated gradients add up: divide so that N steps of batch B give the gradient of one of N x B
        scaled = loss / plan.grad_accum if plan.grad_accum > 1 else loss
        with timer.phase("backward"), mark("backward"):
            (plan.scaler.scale(scaled) if plan.scaler is not None else scaled).backward()
    if accumulating:
        return
    with timer.phase("optimizer"), mark("optimizer"):
        if plan.scaler is not None:
            plan.scaler.step(plan.optimizer)
            plan.scaler.update()
        else:
            plan.optimizer.step()
        plan.optimizer.zero_grad(set_to_none=True)


def infer_step(plan: StepPlan, batch: Any, timer, mark: type) -> None:
    inputs, _ = batch
    with timer.phase("forward"), mark("forward"), plan.autocast():
        plan.last_value = call_model(plan.model, inputs)  # kept, not read: checked for NaN/inf once after the trial

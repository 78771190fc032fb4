"""measure(): warm up, time several trials, aggregate them: the measurement stage of the pipeline (perflab/pipeline.py)."""
from __future__ import annotations

import resource
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from perflab.calibrate import peak_tflops, percent_of_ceiling
from perflab.config import RunConfig
from perflab.cost import cost_per_million
from perflab.errors import interrupt_name
from perflab.ranks import agree_any, agree_max
from perflab.step.calls import check_first_loss, count_non_finite
from perflab.step.data import map_tensors
from perflab.harness.flops import count_flops_per_sample
from perflab.hooks import StepHook
from perflab.harness.interference import LoadProbe, TrialLoad, busy_note, summarize_load
from perflab.harness.loop import run_steps
from perflab.harness.nvml import NvmlSampler
from perflab.step.plan import StepPlan
from perflab.harness.progress import Reporter
from perflab.step.phases import phase_shares
from perflab.stats import percentiles, summarize
from perflab.harness.steady import (UNSTEADY_RANGE_PCT, moving_phase, reach_steady_state, steady_notes,
                                    steps_for_time, trend, unsteady_note)
from perflab.step.timers import NullTimer, make_timer
from perflab.results.metrics import Flops, Gpu, Latency, Memory, Metrics, SteadyState, Throughput, Trend, UnsteadyPhase
from perflab.results import Trial

THROUGHPUT_METHOD = "samples over wall-clock time of the timed steps, device synchronised at both ends"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_zero(batch: Any) -> bool:
    found = []
    map_tensors(batch, lambda t: found.append(bool(t.is_floating_point() and not t.any())) or t)
    return bool(found) and all(found)


def _loader_queue_depth(plan: StepPlan) -> int:
    if plan.data_source != "loader" or plan.workers == 0:
        return 0
    return plan.workers * (plan.prefetch_factor or 2)  # 2: DataLoader's default prefetch factor


@dataclass
class Measurement:
    """What measure() found: the aggregate metrics, the trials they come from, and how they were taken."""

    metrics: Metrics
    trials: list[Trial]
    notes: list[str]
    timing: dict[str, Any]
    flops_per_sample: Optional[float]
    interrupted: Optional[str] = None  # why the trials stopped early (Ctrl-C), if they did
    non_finite: Optional[str] = None  # why the run is invalid (NaN/inf in the last step), if it is


def measure(plan: StepPlan, cfg: RunConfig, reporter: Reporter, hooks: Sequence[StepHook] = ()) -> Measurement:
    """Warm-up then `cfg.trials` timed trials; returns aggregate metrics, trials and timing notes."""
    device = plan.device
    notes: list[str] = []
    reporter.note("preparing: first batch, FLOP count (one eager step)")
    batches = plan.batches(cfg.seed)
    with ExitStack() as stack:
        first_batch = next(batches)
        if _all_zero(first_batch):
            notes.append("the first batch's float inputs are all zeros: timings on zeros can be optimistic")
        if len(plan.workload.dataset) < plan.batch_size:
            notes.append(f"the dataset has {len(plan.workload.dataset)} items, fewer than one batch of "
                         f"{plan.batch_size}: items repeat within each batch (Workload.repeat_items)")
        flops_per_sample = count_flops_per_sample(plan, first_batch)
        if flops_per_sample is None:  # the count may have stopped before its step checked the loss
            check_first_loss(plan, first_batch)
        stack.enter_context(plan.stepping())
        warmup_s, first_step_s = _warm_up(plan, batches, cfg.warmup, reporter)
        steps_per_trial, steady = cfg.steps, None
        if plan.data_source == "loader" and (plan.workers or device.type == "cuda"):
            # A loader's prefilled queue and its bursts make short trials disagree (measured on the H100: 45%
            # spread at 8 workers before this); on a CPU run the loader and the step share the same cores.
            queued = max(_loader_queue_depth(plan), 4)
            reporter.note(f"reaching a steady state: untimed windows of {queued} steps until the step time settles")
            steady = reach_steady_state(plan, batches, queued, lambda: _synchronize(device), agree=agree_any)
            if device.type == "cuda":
                steps_per_trial = agree_max(steps_for_time(cfg.steps, steady["step_s"], cfg.min_trial_s,
                                                            cycle=plan.workers))
            notes += steady_notes(steady, steps_per_trial, cfg)
        warmup_peak_mb = None
        if device.type == "cuda":
            # Warm-up peaks (compilation, autotuning, graph capture) are kept apart from the timed steps'.
            warmup_peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
            torch.cuda.reset_peak_memory_stats(device)
        sampler = stack.enter_context(NvmlSampler(device.index if device.type == "cuda" else None))
        for hook in hooks:
            stack.enter_context(hook)
        trials, timer_method, loads, interrupted = _timed_trials(plan, batches, cfg, steps_per_trial, reporter,
                                                                 hooks)
        non_finite = _non_finite_reason(plan) if trials else None
    if not trials:
        return Measurement(metrics=Metrics(warmup_s=warmup_s, first_step_s=first_step_s), trials=[], notes=notes,
                           timing={"data_source": plan.data_source}, flops_per_sample=flops_per_sample,
                           interrupted=interrupted)
    metrics = aggregate(trials, plan.batch_size)
    metrics.warmup_s, metrics.first_step_s = warmup_s, first_step_s
    metrics.memory = memory_metrics(device)
    if warmup_peak_mb is not None:
        metrics.memory.peak_allocated_incl_warmup_mb = max(warmup_peak_mb, metrics.memory.peak_allocated_mb)
        if plan.step_fn is not None or cfg.compile == "reduce-overhead":
            notes.append("CUDA graphs keep their memory in private pools allocated at capture (in warm-up): "
                         "see peak_reserved_mb and peak_allocated_incl_warmup_mb, not only peak_allocated_mb")
    metrics.gpu = Gpu.from_dict(sampler.summary())
    metrics.cost_per_million_samples = cost_per_million(cfg.gpu_cost_per_hour, metrics.throughput)
    metrics.flops = _flops(flops_per_sample, metrics.throughput, device, cfg)
    if plan.generation is not None:
        metrics.flops.note = "generation: decode is bound by memory bandwidth, see metrics.generation"
    metrics.compile_s = first_step_s if cfg.compile or cfg.cuda_graphs else None
    metrics.interference = summarize_load(loads)
    metrics.steady_state = SteadyState.from_dict(steady)
    metrics.steady = metrics.throughput_samples_per_s.range_pct <= UNSTEADY_RANGE_PCT
    if not metrics.steady:
        metrics.unsteady_phase = UnsteadyPhase.from_dict(moving_phase([t.phase_ms for t in trials]))
        metrics.throughput_trend = Trend.from_dict(trend([t.throughput_samples_per_s for t in trials]))
    notes += [note for note in (busy_note(metrics.interference), unsteady_note(metrics)) if note]
    if interrupted:
        notes.append(interrupted)
    timing = {
        "throughput": THROUGHPUT_METHOD,
        "latency": "per step, from the phase timer's step starts: " + timer_method,
        "phases": timer_method,
        "data_source": plan.data_source,
    }
    return Measurement(metrics=metrics, trials=trials, notes=notes, timing=timing, flops_per_sample=flops_per_sample,
                       interrupted=interrupted, non_finite=non_finite)


def _non_finite_reason(plan: StepPlan) -> Optional[str]:
    """A reason when the last step's loss (train) or outputs (infer) hold NaN/inf: read once, after a trial."""
    bad = count_non_finite(plan.last_step_value())  # tensor, tuple, dict or dataclass outputs
    if not bad:
        return None
    what = "loss" if plan.mode == "train" else "outputs"
    return (f"the model diverged: the last timed step's {what} hold {bad} NaN/inf value(s); timings of a diverged "
            "model are not meaningful (check the learning rate, the loss and the inputs; fp16 overflows at 65504)")


def _warm_up(plan: StepPlan, batches, steps: int, reporter: Reporter) -> tuple[float, Optional[float]]:
    """Seconds of the whole warm-up and of its first step (compilation, autotuning): (0.0, None) without one."""
    if steps == 0:
        return 0.0, None
    reporter.start("warm-up", steps)
    began = time.perf_counter()
    run_steps(plan, batches, 1, NullTimer(), reporter.advance)
    _synchronize(plan.device)
    first_step_s = time.perf_counter() - began
    run_steps(plan, batches, steps - 1, NullTimer(), reporter.advance)
    _synchronize(plan.device)
    reporter.finish()
    return time.perf_counter() - began, first_step_s


def _timed_trials(plan: StepPlan, batches, cfg: RunConfig, steps: int, reporter: Reporter,
                  hooks: Sequence[StepHook]) -> tuple[list[Trial], str, list[TrialLoad], Optional[str]]:
    """The timed trials, the machine's load during each, and why they stopped early (Ctrl-C), if they did."""
    trials, loads = [], []
    steps_done = 0
    probe = LoadProbe(plan.device.index if plan.device.type == "cuda" else None)
    method = make_timer(plan.device, cfg.sync_phases).method
    reporter.start(f"{cfg.trials} trials x {steps} steps", cfg.trials * steps)
    try:
        for _ in range(cfg.trials):
            timer = make_timer(plan.device, cfg.sync_phases)

            def after_hooks(timer=timer) -> None:
                nonlocal steps_done
                for hook in hooks:
                    hook.after_step(plan, timer, steps_done)
                steps_done += 1
                reporter.advance()
            probe.begin()
            _synchronize(plan.device)
            began = time.perf_counter()
            run_steps(plan, batches, steps, timer, after_hooks)
            _synchronize(plan.device)
            wall_s = time.perf_counter() - began
            loads.append(probe.end())
            trials.append(_trial(wall_s, steps, plan.batch_size, timer))
    except KeyboardInterrupt as err:
        partial = steps_done - len(trials) * steps
        during = f" ({partial} steps into trial {len(trials) + 1})" if partial else ""
        return trials, method, loads, (f"interrupted by {interrupt_name(err)} after {len(trials)} of {cfg.trials} "
                                       f"trials{during}; what finished is kept")
    finally:
        reporter.finish()
    return trials, method, loads, None


def _trial(wall_s: float, steps: int, batch_size: int, timer) -> Trial:
    per_step = timer.phase_ms()
    names = sorted({name for step in per_step for name in step})
    phase_means = {name: float(np.mean([step.get(name, 0.0) for step in per_step])) for name in names}
    return Trial(wall_s=wall_s, steps=steps, samples=steps * batch_size,
                 throughput_samples_per_s=steps * batch_size / wall_s,
                 step_ms=[float(ms) for ms in timer.step_ms()], phase_ms=phase_means)


def aggregate(trials: list[Trial], batch_size: int) -> Metrics:
    """Median and spread of throughput over trials; latency percentiles over all steps; phase means per step.

    The phases and the step they share are one aggregate, the mean over every timed step of every trial: a median
    of the trials' phase means set against the mean step (as before) let a generate run's shares reach 113.6%."""
    all_steps = [ms for trial in trials for ms in trial.step_ms]
    latency = percentiles(all_steps)
    latency.update(mean=float(np.mean(all_steps)), min=float(np.min(all_steps)), max=float(np.max(all_steps)))
    names = sorted({name for trial in trials for name in trial.phase_ms})
    steps = sum(len(trial.step_ms) for trial in trials)
    phases = {name: sum(trial.phase_ms.get(name, 0.0) * len(trial.step_ms) for trial in trials) / steps
              for name in names}
    phases["unattributed"] = max(0.0, latency["mean"] - sum(phases.values()))
    return Metrics(
        throughput_samples_per_s=Throughput.from_dict(summarize([trial.throughput_samples_per_s for trial in trials])),
        latency_ms=Latency.from_dict(latency),
        phases_ms=phases,
        phase_share_pct=phase_shares(phases, latency["mean"]),
        batch_size=batch_size,
    )


def memory_metrics(device: torch.device) -> Memory:
    """Peak allocated and reserved device memory (CUDA), or the host process's peak RSS (CPU)."""
    if device.type == "cuda":
        return Memory(peak_allocated_mb=torch.cuda.max_memory_allocated(device) / 2**20,
                      peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20,
                      device_total_mb=torch.cuda.get_device_properties(device).total_memory / 2**20)
    return Memory(host_peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _flops(per_sample: Optional[float], throughput: float, device: torch.device, cfg: RunConfig) -> Flops:
    if per_sample is None:
        return Flops(note="torch.utils.flop_counter could not trace this model")
    achieved = per_sample * throughput / 1e12
    peak, source = peak_tflops(device, cfg.precision)
    mfu, over = percent_of_ceiling(achieved, peak, f"achieved TFLOP/s against the {cfg.precision} peak")
    return Flops(per_sample=per_sample, achieved_tflops=achieved, peak_tflops=peak, peak_source=source,
                 mfu_pct=mfu, note=over)

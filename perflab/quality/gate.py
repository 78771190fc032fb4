"""The quality gate: a candidate's outputs (infer) or loss trajectory (train) against the fp32 eager baseline.

Both sides start from deep copies of the untouched workload (identical initial weights), run from the same
seed on the same input batches, and step through the same plan machinery the timed run uses: the compiled
model, the CUDA-graphed step, channels-last inputs, autocast, the gradient scaler. The baseline is the same
config with no lever applied at all (fp32, eager, contiguous, default optimizer; TF32 off on CUDA).

The candidate runs through its own data path (loader, prefetcher, GPU augmentation, stream pipeline); each
batch its steps received is copied and fed to the baseline, so both see identical inputs. Dropout is
switched off on both sides so that the comparison measures arithmetic, not random streams (compiled and
graphed kernels draw random numbers differently from eager ones). docs/quality.md has the tolerances and
the measurements behind them.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import math
import time
from typing import Any, Optional

import torch
from torch import nn

from perflab.errors import PerflabError
from perflab.quality import baseline_cache
from perflab.step.calls import inputs_from_call
from perflab.step.data import map_tensors
from perflab.harness.loop import run_steps
from perflab.step.plan import StepPlan
from perflab.levers.plan import build_plan
from perflab.step.timers import NullTimer
from perflab.quality.outputs import (Observed, fp64_errors, judge_outputs, observe_output, over_tolerance_only,
                                     verdict_with, with_fp64_reference)
from perflab.results.quality import GateCandidate, LossFigures, QualityVerdict, Tolerance

# Relative output error ‖out − ref‖ / ‖ref‖ allowed in inference, by the candidate's precision. Conventional
# values, with bf16 at 2e-2: its 8-bit mantissa measured up to 9.5e-3 on a 50-layer ResNet (docs/quality.md).
INFER_RTOL = {"fp32": 1e-5, "tf32": 1e-3, "bf16": 2e-2, "fp16": 1e-2}
# Relative final-loss delta allowed after `quality_steps` training steps, by precision: 5-20x the largest
# delta measured on workloads whose training is not chaotic (docs/quality.md).
TRAIN_LOSS_RTOL = {"fp32": 1e-4, "tf32": 2e-3, "bf16": 1e-2, "fp16": 1e-2}
# Some trainings amplify rounding chaotically (a random-init ResNet-50 with BatchNorm on a small batch turns a
# 1e-7 weight nudge into a several-% loss change within 8 steps). So the gate also runs the baseline with its
# weights nudged at fp32 rounding level, and allows NOISE_FACTOR x the largest loss delta that run shows.
ROUNDING_NOISE = 2.0**-23
NOISE_FACTOR = 3.0
# How far the noise floor may widen the precision tolerance and still leave a verdict. Past this factor the training
# is so chaotic that a broken lever's loss hides in its own noise: a delta between the precision tolerance and the
# widened one is then "inconclusive", never a pass (docs/quality.md, "The noise floor").
MAX_NOISE_WIDENING = 10.0
BASELINE = "fp32 eager, no levers (TF32 off, contiguous, default optimizer), same seed, weights and inputs"
CACHED = "; its losses read from an earlier trial of this tune (same settings, weights and batches)"


def precision_tolerance(cfg) -> Tolerance:
    """The tolerance before any noise floor: the user's override, or the default for the precision."""
    if cfg.mode == "infer":
        override, table, flag = cfg.quality_rtol, INFER_RTOL, "--quality-rtol"
    else:
        override, table, flag = cfg.quality_loss_rtol, TRAIN_LOSS_RTOL, "--quality-loss-rtol"
    if override is not None:
        return Tolerance(rtol=float(override), source=flag)
    return Tolerance(rtol=table[cfg.precision], source=f"{cfg.precision} default")


def run_model_gate(workload, cfg, device: torch.device) -> QualityVerdict:
    """One process's gate: the candidate's outputs (infer) or loss trajectory (train) against fp32 eager."""
    began = time.perf_counter()
    tolerance = precision_tolerance(cfg)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the timed run's random state is not the gate's business
        levers, inputs, candidate = run_candidate(workload, cfg, device)
        inputs = [_contiguous(batch) for batch in inputs]
        cached = False
        if cfg.mode == "train":
            baseline, nudged, cached = trained_baselines(workload, cfg, device, inputs, [],
                                                         need_nudged=tolerance.source != "--quality-loss-rtol")
            if nudged is not None:
                tolerance = with_noise_floor(tolerance, baseline, nudged)
        else:
            baseline = observe(gate_plan(workload, cfg, device, levers=[]), inputs, cfg)
    if cfg.mode == "infer":
        verdict = judge_outputs(baseline, candidate, tolerance.rtol, tolerance.source, workload.is_classifier)
        if over_tolerance_only(verdict) and tolerance.source != "--quality-rtol":
            with torch.random.fork_rng(devices=devices):
                reference = float64_outputs(workload, cfg, device, inputs)
            if reference is not None:
                errors = fp64_errors(baseline, candidate, reference)
                tolerance = with_fp64_reference(tolerance, errors)
                verdict = judge_outputs(baseline, candidate, tolerance.rtol, tolerance.source,
                                        workload.is_classifier, fp64_errors=errors)
    del inputs
    _release_memory(device)
    if cfg.mode == "infer":
        verdict.batches = cfg.quality_steps
    else:
        verdict = judge_losses(baseline, candidate, tolerance)
        verdict.steps = cfg.quality_steps
    verdict.mode, verdict.baseline, verdict.tolerances = cfg.mode, BASELINE + (CACHED if cached else ""), tolerance
    verdict.candidate = GateCandidate(levers=levers, precision=cfg.precision)
    verdict.seconds = round(time.perf_counter() - began, 3)
    return verdict


def trained_baselines(workload, cfg, device: torch.device, inputs: list[Any], levers: list,
                      need_nudged: bool) -> tuple[list[float], Optional[list[float]], bool]:
    """The baseline's loss trajectory, its nudged twin's (when `need_nudged`: the noise floor), and whether both came
    from the cache an earlier trial of the same tune stored (quality/baseline_cache.py) instead of training now."""
    key = baseline_cache.baseline_key(cfg, workload.model, inputs, levers) if baseline_cache.cache_folder() else None
    stored = baseline_cache.load(key) if key else None
    if stored is not None and (stored[1] is not None or not need_nudged):
        return stored[0], stored[1] if need_nudged else None, True
    baseline = observe(gate_plan(workload, cfg, device, levers=levers), inputs, cfg)
    nudged = (observe(gate_plan(workload, cfg, device, levers=levers, perturb_seed=cfg.seed + 1), inputs, cfg)
              if need_nudged else None)
    if key:
        baseline_cache.store(key, baseline, nudged)
    return baseline, nudged, False


def run_candidate(workload, cfg, device: torch.device) -> tuple[list[str], list[Any], list[Any]]:
    """The candidate's lever names, the batches its steps received, and what its steps computed.

    The candidate runs exactly as timed: its own loader, prefetcher, GPU augmentation or stream pipeline
    deliver the batches; the recorder keeps a copy of each, which becomes the baseline's input.
    """
    plan = gate_plan(workload, cfg, device, levers=None)
    try:
        recorder = _Recorder(plan)
        return list(plan.levers), *_steps(plan, recorder, plan.batches(cfg.seed), cfg)
    finally:
        plan.cleanup()


def with_noise_floor(tolerance: Tolerance, baseline: list[float], nudged: list[float]) -> Tolerance:
    """Raise the loss tolerance to NOISE_FACTOR x the baseline's own sensitivity to rounding, if larger; record how
    many times the precision tolerance that is (`widening`)."""
    pairs = list(zip(baseline, nudged))
    finite = all(math.isfinite(a) and math.isfinite(b) for a, b in pairs)
    floor = max(abs(b - a) / abs(a) if a else abs(b - a) for a, b in pairs) if finite else None
    tolerance = Tolerance.from_dict(tolerance)  # a JSON-shaped dict too (tests, recorded tolerances)
    tolerance = dataclasses.replace(tolerance, precision_rtol=tolerance.rtol, noise_floor=floor,
                                    noise_factor=NOISE_FACTOR, widening=1.0, max_widening=MAX_NOISE_WIDENING)
    if floor is not None and NOISE_FACTOR * floor > tolerance.rtol:
        tolerance = dataclasses.replace(tolerance, rtol=NOISE_FACTOR * floor,
                                        source=f"noise floor {NOISE_FACTOR:g} x {floor:.1e}",
                                        widening=NOISE_FACTOR * floor / tolerance.rtol)
    return tolerance


def float64_outputs(workload, cfg, device: torch.device, inputs: list[Any]) -> Optional[list[Observed]]:
    """The baseline's outputs with its weights and inputs in float64; None where the model cannot run so (an op
    without a float64 kernel, no memory for it): the candidate is then judged as it was."""
    def widen(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.double() if tensor.is_floating_point() else tensor
    try:
        plan = gate_plan(workload, cfg, device, levers=[], float64=True)
        return observe(plan, [map_tensors(batch, widen) for batch in inputs], cfg)
    except (RuntimeError, TypeError, NotImplementedError, ValueError):
        return None
    finally:
        _release_memory(device)


def gate_plan(workload, cfg, device: torch.device, levers, perturb_seed: Optional[int] = None,
              float64: bool = False) -> StepPlan:
    """A plan over a private deep copy of the workload (the dataset is shared: it is only read).

    With `perturb_seed`, every floating-point weight is nudged by relative noise at fp32 rounding level; with
    `float64`, the model's weights and buffers are float64 (the inference gate's exact reference).
    """
    private = copy.deepcopy(workload, memo={id(workload.dataset): workload.dataset})
    if float64:
        private.model = private.model.double()
    if cfg.mode == "train":
        # In inference the model is in eval mode and dropout is already off: leaving the modules untouched keeps the
        # compiled candidate's guards valid, so it reuses the timed run's compiled graph (compiles once, not twice).
        _disable_dropout(private.model)
    if perturb_seed is not None:
        gen = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for tensor in private.model.parameters():
                if tensor.is_floating_point():
                    noise = torch.randn(tensor.shape, generator=gen).to(tensor.device, tensor.dtype)
                    tensor.mul_(1 + ROUNDING_NOISE * noise)
    return build_plan(private, cfg, device, levers)


def _disable_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        elif isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0


def _contiguous(batch: Any) -> Any:
    """The baseline's inputs: the same values in the default (contiguous) layout."""
    return map_tensors(batch, lambda tensor: tensor.contiguous())


def _clone(batch: Any) -> Any:
    return map_tensors(batch, lambda tensor: tensor.detach().clone())


class _Recorder:
    """Wraps the plan's model, loss and step function so the gate sees what each step received and computed.

    A CUDA-graphed step calls the model and loss only while capturing; the tensors recorded then are the
    graph's static outputs, which every replay rewrites, so reading them after a replay reads that replay's
    values. A custom `step_fn` that calls neither may expose `last_output` / `last_loss` instead.
    """

    def __init__(self, plan: StepPlan):
        self.model, self.loss_fn, self.step_fn = plan.model, plan.loss_fn, plan.step_fn
        self.output_key = plan.workload.output_key
        self.output: Any = None
        self.loss: Optional[torch.Tensor] = None
        self.inputs: Any = None
        self.target: Any = None
        self.batch: Any = None
        plan.model = self.forward
        if plan.loss_fn is not None:
            plan.loss_fn = self.compute_loss
        if plan.step_fn is not None:
            plan.step_fn = self.step

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.inputs = _clone(inputs_from_call(args, kwargs))
        self.output = self.model(*args, **kwargs)
        return self.output

    def compute_loss(self, output: Any, target: Any) -> torch.Tensor:
        self.target = _clone(target)
        self.loss = self.loss_fn(output, target)
        return self.loss

    def step(self, batch: Any) -> None:
        self.batch = _clone(batch)
        self.step_fn(batch)

    def step_batch(self) -> Any:
        """The batch the last step received (inputs, target)."""
        return self.batch if self.step_fn is not None else (self.inputs, self.target)

    def read(self, mode: str) -> Any:
        """The last step's outputs (an Observed of float64 CPU tensors) or loss (a float)."""
        if mode == "infer":
            output = getattr(self.step_fn, "last_output", None)
            output = self.output if output is None else output
            if output is None:
                raise PerflabError("the quality gate cannot see this step's outputs (its step function calls "
                                   "neither the model nor sets last_output); add --no-check-quality")
            return observe_output(output, self.output_key)
        loss = getattr(self.step_fn, "last_loss", None)
        loss = self.loss if loss is None else loss
        if loss is None:
            raise PerflabError("the quality gate cannot see this step's loss (its step function calls neither "
                               "the loss nor sets last_loss); add --no-check-quality")
        return float(loss.detach().float())


def observe(plan: StepPlan, inputs: list[Any], cfg) -> list[Any]:
    """Run the plan on the given device batches, one step each, then clean it up; per step, what it computed."""
    try:
        plan.data_source, plan.device_feeder, plan.gpu_transform = "device", None, None  # inputs are ready
        return _steps(plan, _Recorder(plan), iter(inputs), cfg)[1]
    finally:
        plan.cleanup()


def _steps(plan: StepPlan, recorder: _Recorder, batches, cfg) -> tuple[list[Any], list[Any]]:
    """`cfg.quality_steps` steps through the timed loop's code; (batches received, outputs or losses)."""
    plan.markers = False
    received, observed = [], []
    with plan.stepping():
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.quality_steps):
            run_steps(plan, batches, 1, NullTimer())
            observed.append(recorder.read(plan.mode))
            received.append(recorder.step_batch())
    return received, observed


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def judge_losses(baseline: list[float], candidate: list[float], tolerance: Tolerance) -> QualityVerdict:
    """Training verdict: any NaN/inf loss fails; then the relative delta of the final loss against the tolerance
    (`precision_tolerance`, maybe widened by `with_noise_floor`). A delta that passes only because the noise floor
    widened the tolerance past MAX_NOISE_WIDENING is inconclusive."""
    tolerance = Tolerance.from_dict(tolerance)
    rtol, source = tolerance.rtol, tolerance.source
    deltas = [abs(c - b) / abs(b) if b else abs(c - b) for b, c in zip(baseline, candidate)]
    gate_figures = LossFigures(baseline_losses=baseline, candidate_losses=candidate, final_loss_baseline=baseline[-1],
                               final_loss_candidate=candidate[-1], final_loss_rel_delta=deltas[-1],
                               max_loss_rel_delta=max(deltas))
    if not all(math.isfinite(loss) for loss in baseline):
        return verdict_with("fail", "the fp32 eager baseline's loss itself went NaN/inf: the workload is unstable, "
                            "not the lever", gate_figures)
    bad = [step for step, loss in enumerate(candidate) if not math.isfinite(loss)]
    if bad:
        return verdict_with("fail", f"candidate loss is NaN/inf from step {bad[0]} of {len(candidate)}", gate_figures)
    summary = (f"final loss {candidate[-1]:.5g} vs baseline {baseline[-1]:.5g} after {len(candidate)} steps: "
               f"relative delta {deltas[-1]:.2e}")
    if deltas[-1] > rtol:
        return verdict_with("fail", f"{summary} > {rtol:.1e} ({source}) tolerance", gate_figures)
    precision_rtol = tolerance.precision_rtol if tolerance.precision_rtol is not None else rtol
    widening = tolerance.widening if tolerance.widening is not None else 1.0
    if deltas[-1] > precision_rtol and widening > MAX_NOISE_WIDENING:
        return verdict_with("inconclusive", f"{summary} is over the {precision_rtol:.1e} precision tolerance and "
                            f"inside only the {rtol:.1e} noise floor, {widening:.0f}x wider (more than the "
                            f"{MAX_NOISE_WIDENING:g}x bound): this training is too chaotic to tell a correct lever "
                            "from a broken one; check the lever in --mode infer, or set --quality-loss-rtol",
                            gate_figures)
    return verdict_with("pass", f"{summary} <= {rtol:.1e} ({source})", gate_figures)

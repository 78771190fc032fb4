"""run_script(): run a user's script unchanged with perflab attached, and turn what it saw into a Result.

    outcome = run_script(parse_command(["python", "train.py", "--epochs", "1"]), "runs/x", warmup=5,
                         capture=CaptureOptions(wait=1, warmup=2, active=3))

The script runs in this process (as `python train.py` would run it); its exit code, exceptions and Ctrl-C are
caught, reported in the outcome, and never lose what was measured up to then.
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from perflab.config import ScriptConfig
from perflab.errors import EXIT_OUT_OF_MEMORY, WorkloadExited, is_out_of_memory
from perflab.harness.nvml import NvmlSampler
from perflab.oom import OutOfMemory, free_after
from perflab.harness.runner import aggregate, memory_metrics
from perflab.results.metrics import Gpu
from perflab.pipeline import new_result
from perflab.profile.capture import CaptureOptions, ProfilerCapture
from perflab.results import Result, Trial, write_json_atomic
from perflab.script.attach import ScriptProbe
from perflab.script.command import ScriptCommand, check_command, execute, script_traceback
from perflab.script.levers import levers_in_code
from perflab.script.steps import StepDetector
from perflab.script.timeline import StepTimeline
from perflab.diagnose import DIAGNOSIS_FILE, diagnose

THROUGHPUT_METHOD = ("steps after the warm-up over their summed duration, from step boundary to step boundary "
                     "(CUDA events on the stream on a GPU: idle time included; host clock on the CPU)")
PHASE_SOURCES = ("data wait at DataLoader __next__ (host clock); h2d at .to()/.cuda() of loader tensors and, inside "
                 "steps, of any CPU tensor; forward at the outermost module calls; backward at Tensor.backward; "
                 "optimizer at optimizer.step")


@dataclass
class ScriptOutcome:
    """What running the script gave: the result (None if no step finished), the diagnosis, how the script ended."""

    result: Optional[Result]
    diagnosis: object  # perflab.diagnose.Diagnosis or None
    exit_code: int
    traceback: Optional[str] = None  # the script's own traceback when it raised
    interrupted: bool = False
    steps_seen: int = 0
    shortfall: Optional[str] = None  # why no trace: the script ran fewer steps than the profiler needed
    out_of_memory: Optional[OutOfMemory] = None  # the script ran out of memory (exit code 3, docs/memory.md)


def run_script(command: ScriptCommand, out_dir: Union[str, Path], warmup: int = 5,
               capture: Optional[CaptureOptions] = None, perflab_argv: Optional[list[str]] = None) -> ScriptOutcome:
    """Run the script with perflab attached; save result.json (and trace.json, diagnosis.json when profiling)."""
    check_command(command)
    out_dir = Path(out_dir)
    timeline = StepTimeline()
    profiler = _profiler(out_dir, capture, warmup) if capture is not None else None

    def on_boundary(switched: bool) -> None:
        timeline.boundary(switched)
        if profiler is not None and timeline.boundaries:
            profiler.after_step(None, None, timeline.boundaries)

    detector = StepDetector(on_boundary)
    exit_code, trace_text, interrupted, out_of_memory = 0, None, False, None
    began = time.perf_counter()
    with NvmlSampler(0 if torch.cuda.is_available() else None) as sampler:
        with (profiler if profiler is not None else nullcontext()), ScriptProbe(detector, timeline) as probe:
            try:
                execute(command)
            except SystemExit as done:
                exit_code = _exit_code(done)
            except WorkloadExited:  # the script's os._exit(0) (perflab.cli._process): its end, with success
                exit_code = 0
            except KeyboardInterrupt:
                exit_code, interrupted = 130, True
            except BaseException as error:  # the script's own failure: shown as its traceback, never swallowed
                exit_code, trace_text = 1, script_traceback(error)
                if is_out_of_memory(error):  # an OOM is a result: the short block, the traceback under --debug
                    out_of_memory = OutOfMemory.from_error(error, _script_device())
                    exit_code = EXIT_OUT_OF_MEMORY
                    free_after(error)
        timeline.close()
    elapsed_s = time.perf_counter() - began
    result = _result(command, timeline, detector, probe, sampler, warmup, elapsed_s, perflab_argv)
    outcome = ScriptOutcome(result=result, diagnosis=None, exit_code=exit_code, traceback=trace_text,
                            interrupted=interrupted, steps_seen=timeline.boundaries, out_of_memory=out_of_memory)
    if result is None:
        return outcome
    if out_of_memory is not None:
        result.status, result.status_reason = "oom", out_of_memory.summary()
        result.out_of_memory = out_of_memory.to_dict()
    elif interrupted:  # the figures cover the steps before Ctrl-C: saved, but never as a complete run
        result.status = "interrupted"
        result.status_reason = f"interrupted (Ctrl-C) after {timeline.boundaries} steps; the figures cover those"
        result.notes.append(result.status_reason)
    else:
        diverged = probe.non_finite_reason()
        if diverged:  # as `perflab run` marks a built-in workload that diverged: saved, never a valid measurement
            result.status, result.status_reason = "invalid", diverged
    if trace_text is not None:
        result.notes.append(f"the script raised {trace_text.strip().splitlines()[-1]}")
    if profiler is not None:
        outcome.shortfall = _shortfall(profiler.options, timeline.boundaries, warmup, detector)
        if outcome.shortfall:
            result.notes.append(outcome.shortfall)
        else:
            profiler.finish(result)
            if profiler.written:
                outcome.diagnosis = _diagnose(profiler, result, out_dir)
    result.save(out_dir)
    return outcome


def _profiler(out_dir: Path, options: CaptureOptions, warmup: int) -> ProfilerCapture:
    # The schedule counts the script's steps from its first; its warm-up steps are skipped before `wait`.
    capture = ProfilerCapture(out_dir, replace(options, wait=options.wait + warmup))
    capture.cuda = torch.cuda.is_available()  # which device the script uses is known only once it runs
    return capture


def _script_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _exit_code(done: SystemExit) -> int:
    """The process exit status Python would give for this SystemExit (a message means 1, printed to stderr)."""
    if done.code is None:
        return 0
    if isinstance(done.code, int):
        return done.code
    print(done.code, file=sys.stderr)
    return 1


def _shortfall(options: CaptureOptions, steps: int, warmup: int, detector: StepDetector) -> Optional[str]:
    """A sentence saying the script ended before the profiler's active steps, and what to change; None if it did not."""
    needed = options.steps_needed  # options.wait already includes the warm-up steps
    if steps >= needed:
        return None
    return (f"not diagnosed: the script ended after {steps} steps (counted at {detector.describe()}), before the "
            f"profiler's active steps were recorded; it needs (--warmup {warmup} + --wait {options.wait - warmup} + --warmup-steps {options.warmup} + "
            f"--active {options.active} = {needed}); lower those, e.g. --warmup 1 --wait 0 --warmup-steps 1 "
            f"--active {max(1, min(options.active, steps - 2))}, or let the script run longer")


def _diagnose(profiler: ProfilerCapture, result: Result, out_dir: Path):
    diagnosis = diagnose(profiler.trace_path, result)
    result.diagnosis = diagnosis.to_dict()
    result.diagnosis["levers_in_code"] = levers_in_code(diagnosis.levers)
    write_json_atomic(out_dir / DIAGNOSIS_FILE, result.diagnosis)
    result.artifacts["diagnosis"] = DIAGNOSIS_FILE
    return diagnosis


def _result(command: ScriptCommand, timeline: StepTimeline, detector: StepDetector, probe: ScriptProbe,
            sampler: NvmlSampler, warmup: int, elapsed_s: float, perflab_argv: Optional[list[str]]) -> Optional[Result]:
    """The Result of the script's timed steps (those after `warmup`); None when none finished."""
    step_ms, phase_ms = timeline.steps()
    timed_ms, timed_phases = step_ms[warmup:], phase_ms[warmup:]
    if not timed_ms:
        return None
    device = torch.device(timeline.device or "cpu")
    batch_size = probe.batch_size or 1
    wall_s = float(np.sum(timed_ms)) / 1e3
    names = sorted({name for step in timed_phases for name in step})
    trial = Trial(wall_s=wall_s, steps=len(timed_ms), samples=len(timed_ms) * batch_size,
                  throughput_samples_per_s=len(timed_ms) * batch_size / wall_s, step_ms=[float(ms) for ms in timed_ms],
                  phase_ms={name: float(np.mean([step.get(name, 0.0) for step in timed_phases])) for name in names})
    metrics = aggregate([trial], batch_size)
    metrics.steps_per_s = len(timed_ms) / wall_s
    metrics.steps_seen = timeline.boundaries
    metrics.warmup_s = float(np.sum(step_ms[:warmup])) / 1e3
    metrics.first_step_s = step_ms[0] / 1e3
    metrics.script_s = elapsed_s
    metrics.memory = memory_metrics(device)
    metrics.gpu = Gpu.from_dict(sampler.summary())
    notes = [f"steps: {detector.describe()}"]
    if probe.batch_size is None:
        notes.append("no batch size was found (no DataLoader batch or model input tensor): samples/s counts steps")
    if timeline.boundaries > len(step_ms):
        notes.append(f"the first {len(step_ms)} steps were timed; the script ran {timeline.boundaries}")
    config = ScriptConfig(workload=f"script:{command.name}", mode="train" if probe.optimizer_steps else "infer",
                          batch_size=probe.batch_size, device=device.type, warmup=warmup, steps=len(timed_ms),
                          trials=1, workers=probe.workers, script=command.to_dict(), step_source=detector.source)
    model = probe.model
    workload = {"name": command.name, "description": f"the script `{' '.join(command.shown())}`, run unchanged",
                "parameters": sum(p.numel() for p in model.parameters()) if model is not None else None,
                "flops_per_sample": None, "info": {"steps_found_by": detector.describe(), "step_source": detector.source,
                                                   "optimizer_steps": probe.optimizer_steps, "batches": probe.batches}}
    return new_result(
        config, device, workload, ["perflab", *(perflab_argv or []), "--", *command.shown()], trials=[trial],
        metrics=metrics, notes=notes,
        timing={"throughput": THROUGHPUT_METHOD, "latency": "per step, between consecutive step boundaries",
                "phases": _timer_method(timeline), "phase_sources": PHASE_SOURCES, "steps": detector.describe()})


def _timer_method(timeline: StepTimeline) -> str:
    return timeline.timer.method if timeline.timer is not None else "no timer"


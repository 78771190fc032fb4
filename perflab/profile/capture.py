"""Scheduled torch.profiler capture as a StepHook: skip `wait` steps, warm the profiler up, record `active`.

The hook wears the timed trials (`perflab.run(..., hooks=[ProfilerCapture(...)])`); the loop itself only
calls `after_step`, which advances the profiler's schedule. The Chrome trace lands next to result.json.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch.profiler import ProfilerActivity

from perflab.errors import PerflabError
from perflab.harness.hooks import StepHook

TRACE_FILE = "trace.json"


@dataclass
class CaptureOptions:
    """The profiler schedule (in timed steps) and what to record besides op and kernel times."""

    wait: int = 1
    warmup: int = 2
    active: int = 3
    record_shapes: bool = True  # input shapes on aten ops: FLOPs and bytes for the roofline
    with_stack: bool = False
    with_modules: bool = True  # a `module: <path>` range around each submodule's forward (eager models only)
    profile_memory: bool = False
    gzip: bool = False  # write trace.json.gz instead of trace.json

    @property
    def steps_needed(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def trace_name(self) -> str:
        return TRACE_FILE + (".gz" if self.gzip else "")

    def check(self, steps_per_trial: int) -> "CaptureOptions":
        """Raise PerflabError unless the schedule fits in the first timed trial."""
        if self.wait < 0 or self.warmup < 0 or self.active <= 0:
            raise PerflabError(f"profiler schedule wait={self.wait} warmup={self.warmup} active={self.active}: "
                               "wait and warm-up must be 0 or more and --active at least 1")
        if steps_per_trial < self.steps_needed:
            raise PerflabError(
                f"--steps {steps_per_trial} is fewer than the profiler schedule needs (wait {self.wait} + "
                f"warm-up {self.warmup} + active {self.active} = {self.steps_needed}); use --steps "
                f"{self.steps_needed} or more, or lower --active")
        return self


def whole_loader_cycles(options: CaptureOptions, workers: int) -> tuple[CaptureOptions, Optional[str]]:
    """The schedule with its active steps rounded up to whole cycles of the DataLoader's `workers`, and a note
    saying so (None when nothing changed).

    A loader returns batch i from worker i mod N, in order, so a loader-bound run's steps come in waves: N
    batches close together, then a wait. Three traced steps of a 16-worker loader see a wave or a wait
    depending on where they fall: on the H100 a 16-worker driving run whose timed steps waited 72% of the time
    for data was profiled at 2% data wait and diagnosed "no clear bottleneck". Whole cycles see both."""
    if workers < 2 or options.active % workers == 0:
        return options, None
    active = workers * math.ceil(options.active / workers)
    note = (f"the trace records {active} steps, not --active {options.active}: whole cycles of the {workers} "
            "DataLoader workers, whose batches arrive in waves (fewer steps would see a wave or a wait, depending "
            "on where they fall, and so would the input-pipeline diagnosis)")
    return dataclasses.replace(options, active=active), note


class ProfilerCapture(StepHook):
    """Records `active` timed steps of the first trial with torch.profiler and writes a Chrome trace.

    The schedule fits inside the first trial (CaptureOptions.check), so the host synchronisation between
    trials never appears in the trace as if the step had caused it.
    """

    def __init__(self, out_dir: Union[str, Path], options: Optional[CaptureOptions] = None, rank: int = 0):
        self.out_dir = Path(out_dir)
        self.options = options or CaptureOptions()
        self.trace_path = self.out_dir / rank_trace_name(self.options.trace_name, rank)
        self.profiler: Optional[torch.profiler.profile] = None
        self.cuda = False
        self.distributed = False
        self.written = False
        self.marks = None

    def start(self, plan) -> None:
        self.cuda = plan.device.type == "cuda"
        self.distributed = plan.data_shard[1] > 1
        if self.options.with_modules and plan.model is plan.eager_model:
            from perflab.profile.module_marks import module_marks
            self.marks = module_marks(plan.eager_model, getattr(plan, "loss_fn", None))

    def __enter__(self) -> "ProfilerCapture":
        opts = self.options
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=opts.wait, warmup=opts.warmup, active=opts.active, repeat=1),
            on_trace_ready=self._write,
            record_shapes=opts.record_shapes,
            with_stack=opts.with_stack,
            profile_memory=opts.profile_memory,
        )
        _quiet_profiler_warnings(self.cuda)
        self.profiler.__enter__()
        if self.marks is not None:
            self.marks.__enter__()
        return self

    def after_step(self, plan, timer, step: int) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def __exit__(self, *exc) -> None:
        if self.marks is not None:
            self.marks.__exit__(*exc)
            self.marks = None
        if self.profiler is not None:
            self.profiler.__exit__(*exc)
            self.profiler = None

    def _write(self, profiler: torch.profiler.profile) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.trace_path))  # torch gzips when the name ends in .gz
        self.written = True
        if self.trace_path.name == self.options.trace_name:  # rank 0 only: torch's matcher where it exists
            from perflab.diagnose.torch_matcher import save_torch_matches
            save_torch_matches(profiler, self.out_dir)

    def finish(self, result) -> None:
        if not self.written:
            result.notes.append("profiler: the schedule never completed, so no trace was written")
            return
        result.artifacts["trace"] = self.trace_path.name
        result.metrics["profile"] = {**asdict(self.options), "activities": "cpu+cuda" if self.cuda else "cpu"}
        if self.distributed and self.cuda:
            # each rank reads its own trace (it may be on another node); rank 0 gathers the figures
            from perflab.diagnose.trace import load_trace
            from perflab.distributed.collectives import communication_profile
            profile = communication_profile(load_trace(self.trace_path))
            result.metrics["collectives"] = profile.to_dict() if profile is not None else None
        result.notes.append(f"profiled: steps {self.options.wait + self.options.warmup + 1}-"
                            f"{self.options.steps_needed} of the first trial are in {self.trace_path.name}; "
                            "the profiler slows those steps, so compare timings with `perflab run`")


def rank_trace_name(name: str, rank: int) -> str:
    """trace.json for rank 0 (what `perflab diagnose` reads), trace.rank<N>.json beside it for the others."""
    return name if rank == 0 else name.replace(TRACE_FILE, f"trace.rank{rank}.json")


def capture_argv(options: CaptureOptions) -> list[str]:
    """`perflab profile`'s own options that reproduce `options` (for the ranks of a distributed profile)."""
    argv = ["--wait", str(options.wait), "--warmup-steps", str(options.warmup), "--active", str(options.active)]
    argv.append("--record-shapes" if options.record_shapes else "--no-record-shapes")
    argv += [flag for flag, on in (("--with-stack", options.with_stack), ("--profile-memory", options.profile_memory),
                                   ("--gzip-trace", options.gzip)) if on]
    return argv


# Kineto's log levels run VERBOSE 0 … ERROR 4, USDT 5; above the last, it prints nothing.
KINETO_SILENT = "6"


def _quiet_profiler_warnings(cuda: bool) -> None:
    # torch warns that a schedule clears events between cycles; with repeat=1 there is one cycle.
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    logging.getLogger("torch.profiler").setLevel(logging.ERROR)
    if not cuda:
        # On a CPU-only run Kineto still probes for a GPU and prints "gpuGetDeviceCount failed" and USDT
        # start/stop lines on stderr; none concern a CPU trace. Kineto reads this once, when it first starts;
        # a level the user set is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)


def profile_run(workload, cfg, out_dir: Union[str, Path], options: Optional[CaptureOptions] = None,
                reporter=None, command: Optional[list[str]] = None):
    """Run with a profiler capture, save result.json, trace, diagnosis.json and nsys_command.txt in `out_dir`.

    `workload` is a Workload or a spec; every field of `cfg` applies (checkpoints, --nsys included), and the
    nsys command reproduces it. `command` is what is recorded as the run's command line.
    Returns (result, diagnosis or None, nsys command as a list).
    """
    from perflab.diagnose import DIAGNOSIS_FILE, diagnose
    from perflab.harness.runner import run
    from perflab.profile.nsys import nsys_command, save_nsys_command
    from perflab.diagnose.verdict import Diagnosis
    from perflab.distributed import in_rank, is_primary, needs_launch
    from perflab.results import write_json_atomic

    options, cycle_note = whole_loader_cycles(options or CaptureOptions(), cfg.workers)
    if cycle_note is not None:
        if reporter is not None:
            reporter.note(cycle_note)
        cfg = cfg.replace(steps=max(cfg.steps, options.steps_needed))
    options = options.check(cfg.steps)
    out_dir = Path(out_dir)
    cfg = cfg.replace(out=str(out_dir))
    if command is None:
        command = ["perflab", "profile", *cfg.to_argv("profile"), "--out", str(out_dir)]
    nsys = nsys_command(out_dir, cfg, options.wait + options.warmup, options.active)
    if needs_launch(cfg):  # the ranks profile themselves; rank 0 diagnoses and saves
        from perflab.distributed.launch import launch
        result = launch(cfg, "profile", out_dir, capture_argv(options), recorded_command=command)
        if result is not None and cycle_note is not None:
            result.notes.append(cycle_note)
            result.save(out_dir)
        diagnosis = Diagnosis.from_dict(result.diagnosis) if result and result.diagnosis else None
        return result, diagnosis, nsys
    import torch.distributed as dist
    capture = ProfilerCapture(out_dir, options, rank=dist.get_rank() if in_rank() else 0)
    result = run(workload, cfg, reporter=reporter, command=command, hooks=[capture])
    if not is_primary():
        return result, None, nsys
    if cycle_note is not None:
        result.notes.append(cycle_note)
    result.artifacts["nsys_command"] = save_nsys_command(out_dir, nsys).name
    diagnosis = diagnose(capture.trace_path, result) if capture.written and result.trials else None
    if diagnosis is not None:
        result.diagnosis = diagnosis.to_dict()
        write_json_atomic(out_dir / DIAGNOSIS_FILE, result.diagnosis)
        result.artifacts["diagnosis"] = DIAGNOSIS_FILE
    result.save(out_dir)
    return result, diagnosis, nsys

"""Scheduled torch.profiler capture as a StepHook: skip `wait` steps, warm the profiler up, record `active`.

The hook wears the timed trials (`perflab.run(..., hooks=[ProfilerCapture(...)])`); the loop itself only
calls `after_step`, which advances the profiler's schedule. The Chrome trace lands next to result.json.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch.profiler import ProfilerActivity

from perflab import options as option_table
from perflab.errors import PerflabError, writing
from perflab.hooks import StepHook
from perflab.options import option
from perflab.profile.torch_patterns import save_torch_matches

TRACE_FILE = "trace.json"


PROFILE = ("profile",)
PROFILER = "profiler"


@dataclass
class CaptureOptions:
    """The profiler schedule (in timed steps) and what to record besides op and kernel times; each field is
    `perflab profile`'s option of that name (perflab/options.py derives the flags, the argv of the ranks and of
    tune's profile trials, and the flags a profiled script accepts)."""

    wait: int = option("--wait", int, "timed steps skipped first (default: 1)", PROFILER, 1, minimum=0, metavar="N",
                       commands=PROFILE)
    # dest: the run options already have a `warmup` (untimed steps before the trials)
    warmup: int = option("--warmup-steps", int, "profiler warm-up steps, recorded then discarded (default: 2)",
                         PROFILER, 2, minimum=0, metavar="N", commands=PROFILE, dest="warmup_steps")
    active: int = option("--active", int, "steps in the trace (default: 3; with DataLoader workers, rounded up to "
                         "whole cycles of them)", PROFILER, 3, minimum=1, metavar="N", commands=PROFILE)
    record_shapes: bool = option("--record-shapes", bool, "input shapes on ops: FLOPs and bytes for the roofline "
                                 "(default: on)", PROFILER, True, negatable=True, commands=PROFILE)
    with_stack: bool = option("--with-stack", bool, "Python stacks on ops (bigger trace)", PROFILER, False,
                              commands=PROFILE)
    profile_memory: bool = option("--profile-memory", bool, "allocations and frees (bigger trace)", PROFILER, False,
                                  commands=PROFILE)
    gzip: bool = option("--gzip-trace", bool, "write trace.json.gz instead of trace.json", PROFILER, False,
                        commands=PROFILE)

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

    def __init__(self, out_dir: Union[str, Path], options: Optional[CaptureOptions] = None, rank: int = 0,
                 with_modules: bool = True):
        self.out_dir = Path(out_dir)
        self.options = options or CaptureOptions()
        self.trace_path = self.out_dir / rank_trace_name(self.options.trace_name, rank)
        self.profiler: Optional[torch.profiler.profile] = None
        self.cuda = False
        self.distributed = False
        self.written = False
        self.marks = None
        # a `module: <path>` range around each submodule's forward (eager models only): the operator view's modules
        self.with_modules = with_modules

    def start(self, plan) -> None:
        self.cuda = plan.device.type == "cuda"
        self.distributed = plan.data_shard[1] > 1
        eager = getattr(plan, "eager_model", None)  # a profiled script's plan has no model of perflab's
        if self.with_modules and eager is not None and getattr(plan, "model", None) is eager:
            from perflab.profile.module_marks import module_marks  # only when a model is profiled
            self.marks = module_marks(eager, getattr(plan, "loss_fn", None))

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
        quiet_profiler(self.cuda)
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
        if self.marks is not None:  # the trace is complete: the rest of the trials run without the module hooks
            self.marks.__exit__(None, None, None)
            self.marks = None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with writing(self.trace_path, "the trace"):
            before = _stamp(self.trace_path)  # an earlier run's trace (--overwrite) must not pass for this one's
            profiler.export_chrome_trace(str(self.trace_path))  # torch gzips when the name ends in .gz
            check_written(self.trace_path, before)
        self.written = True
        if self.trace_path.name == self.options.trace_name:  # rank 0 only: torch's matcher where it exists
            save_torch_matches(profiler, self.out_dir)

    def finish(self, result) -> None:
        if not self.written:
            result.notes.append("profiler: the schedule never completed, so no trace was written")
            return
        result.artifacts["trace"] = self.trace_path.name
        result.metrics.profile = {**asdict(self.options), "activities": "cpu+cuda" if self.cuda else "cpu"}
        result.notes.append(f"profiled: steps {self.options.wait + self.options.warmup + 1}-"
                            f"{self.options.steps_needed} of the first trial are in {self.trace_path.name}; "
                            "the profiler slows those steps, so compare timings with `perflab run`")


def check_written(path: Path, before: Optional[tuple[int, int]]) -> None:
    """Raise the OSError behind a trace the profiler failed to write. Kineto writes <path>.tmp in C++, renames it
    when complete and says nothing when the disk is full: then `path` is missing (or still an earlier run's), and
    appending to the cut-short .tmp names the cause (ENOSPC, EFBIG)."""
    if path.suffix == ".gz" or (_stamp(path) not in (None, before) and _ends_json(path)):
        return
    partial = path.with_name(path.name + ".tmp")
    if partial.is_file():
        try:
            with open(partial, "ab") as trace:  # where the profiler's write failed, this one fails too
                trace.write(b" " * 65536)
                trace.flush()
                os.fsync(trace.fileno())
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(path)) from None
        finally:
            partial.unlink(missing_ok=True)
    raise OSError(errno.EIO, "the profiler did not write it completely (is the disk full?)", str(path))


def _stamp(path: Path) -> Optional[tuple[int, int]]:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns


def _ends_json(path: Path) -> bool:
    with open(path, "rb") as trace:
        trace.seek(max(0, path.stat().st_size - 64))
        return trace.read().rstrip().endswith((b"}", b"]"))


def rank_trace_name(name: str, rank: int) -> str:
    """trace.json for rank 0 (what `perflab diagnose` reads), trace.rank<N>.json beside it for the others."""
    return name if rank == 0 else name.replace(TRACE_FILE, f"trace.rank{rank}.json")


def capture_argv(options: CaptureOptions) -> list[str]:
    """`perflab profile`'s own options that reproduce `options` (for the ranks of a distributed profile)."""
    return option_table.to_argv(options, "profile")


# Kineto's log levels run VERBOSE 0 … ERROR 4, USDT 5; above the last, it prints nothing.
KINETO_SILENT = "6"


def quiet_profiler(cuda: bool) -> None:
    # torch warns that a schedule clears events between cycles; with repeat=1 there is one cycle.
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle.*")
    logging.getLogger("torch.profiler").setLevel(logging.ERROR)
    if not cuda:
        # On a CPU-only run Kineto still probes for a GPU and prints "gpuGetDeviceCount failed" and USDT
        # start/stop lines on stderr; none concern a CPU trace. Kineto reads this once, when it first starts;
        # a level the user set is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)

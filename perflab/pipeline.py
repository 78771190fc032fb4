"""The pipeline: workload -> levers -> measurement -> Result, one direction, and the one place that conducts it.

    cfg = resolve_config(config, workload)          # validated; device and batch made concrete (prepare.py)
    workload = load(workload, cfg)                   # seeded, built (a built-in, a plugin, or the caller's)
    with prepared(workload, cfg, device) as prep:    # levers checked and applied to a StepPlan, cleaned up after
        measured = measure(prep.plan, ...)           # the harness stage (serve swaps in its load generator)
    quality = quality_stage(prep, ...)               # the gate, from weights nothing trained
    result = new_result(cfg, device, ...)            # the one constructor of a measured Result

Everything optional is worn around that as a hook (perflab.hooks.StepHook): checkpoints, nsys, the
profiler capture, generation's per-token clock. `run` and `profile_run` are the whole pipeline; sweep points,
tune trials (as `perflab run` processes), scale, rerun and the ranks of a multi-process run go through `run`;
serve reuses `load`, `prepared`, `new_result` and `quality_stage` around its own measurement stage.
"""
from __future__ import annotations

import copy

import dataclasses
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from perflab.checkpoint import checkpoint_hooks
from perflab.config import RunConfig
from perflab.ranks import in_rank, is_primary, needs_launch
from perflab.environment import collect_environment
from perflab.errors import OutOfMemoryFailure, PerflabError, is_out_of_memory
from perflab.hooks import StepHook
from perflab.step.plan import StepPlan
from perflab.harness.progress import Reporter
from perflab.harness.runner import measure
from perflab.oom import OOM_BREAKDOWN_ENV, OutOfMemory, free_after
from perflab.prepare import Prepared, load, prepared, resolve_config, resolve_device
from perflab.results.metrics import Metrics
from perflab.profile.capture import CaptureOptions, ProfilerCapture, capture_argv, whole_loader_cycles
from perflab.profile.nsys import nsys_command, nsys_hooks, save_nsys_command
from perflab.quality import run_quality_gate
from perflab.results import Result, write_json_atomic
from perflab.results.quality import QualityVerdict
from perflab.version import __version__
from perflab.workloads import Workload
from perflab.diagnose import DIAGNOSIS_FILE, diagnose
from perflab.diagnose.communication import communication_profile
from perflab.diagnose.decode import classify_decode
from perflab.diagnose.trace import load_trace
from perflab.diagnose.verdict import Diagnosis


def quality_stage(prep: Prepared, reporter: Reporter) -> Optional[QualityVerdict]:
    """The quality gate of a prepared run (None when it is off): baseline vs candidate from the pristine weights."""
    if prep.pristine is None:
        return None
    with reporter.stage("quality gate: baseline vs candidate from the same weights and inputs"):
        return run_quality_gate(prep.pristine, prep.cfg, prep.device)


def describe_workload(workload: Workload, flops_per_sample: Optional[float]) -> dict[str, Any]:
    model = workload.model
    return {
        "name": workload.name,
        "description": workload.description,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "flops_per_sample": flops_per_sample,
        "info": workload.info,
    }


def new_result(config: RunConfig, device: torch.device, workload: dict[str, Any],
               command: Optional[Sequence[str]], **fields: Any) -> Result:
    """A Result stamped with this machine's environment, the time, perflab's version and the command line."""
    return Result(config=copy.deepcopy(config), environment=collect_environment(device), workload=workload,
                  command=list(command if command is not None else sys.argv),
                  created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), perflab_version=__version__,
                  **{"trials": [], "metrics": Metrics(), **fields})


def config_hooks(cfg: RunConfig) -> list[StepHook]:
    """The hooks the config itself asks for: checkpoints (--checkpoint-every, --resume-from) and --nsys."""
    if cfg.checkpoint_every and not cfg.out:
        raise PerflabError("checkpoint_every needs a directory for checkpoint.pt: set RunConfig.out (--out)")
    return [*checkpoint_hooks(cfg, cfg.out or "."), *nsys_hooks(cfg.nsys)]


def run(workload: Union[Workload, str, None] = None, config: Optional[RunConfig] = None,
        reporter: Optional[Reporter] = None, command: Optional[list[str]] = None,
        hooks: Sequence[StepHook] = ()) -> Optional[Result]:
    """Measure a workload (a Workload, a workload spec, or config.workload) and return its Result.

    With --nproc N the ranks are started here (perflab/distributed/) and the result gathered over all of
    them is returned (None on a node other than node 0 of a multi-node run)."""
    if isinstance(workload, Workload) and not workload.name:  # a plugin's gets its file's name when loaded
        workload = dataclasses.replace(workload, name=type(workload.model).__name__)
    cfg = resolve_config(config or RunConfig(), workload)
    if needs_launch(cfg):
        return _launch(workload, cfg, "run", command)
    device = resolve_device(cfg.device)
    with with_breakdown_advice(cfg, device, command):
        return _run_here(workload, cfg, device, reporter or Reporter(), command, hooks)


def _run_here(workload: Union[Workload, str, None], cfg: RunConfig, device: torch.device, reporter: Reporter,
              command: Optional[list[str]], hooks: Sequence[StepHook]) -> Result:
    """run() in this process: the pipeline's stages, an out-of-memory turned into a result."""
    with out_of_memory_as_result(cfg, device, command):
        workload = load(workload, cfg)
        hooks = [*hooks, *config_hooks(cfg)]
        with prepared(workload, cfg, device) as prep:
            hooks += prep.plan.hooks
            for hook in hooks:
                hook.start(prep.plan)
            measured = measure(prep.plan, cfg, reporter, hooks)
            levers, plan_notes = list(prep.plan.levers), list(prep.plan.notes)
            checksum = _replica_checksum(prep.plan, cfg)
        quality = None if measured.interrupted else quality_stage(prep, reporter)
    status, reason = _status(measured.interrupted, measured.non_finite)
    result = new_result(cfg, device, describe_workload(workload, measured.flops_per_sample), command,
                        trials=measured.trials, metrics=measured.metrics, timing=measured.timing, levers=levers,
                        notes=plan_notes + measured.notes, quality=quality, status=status, status_reason=reason)
    for hook in hooks:
        hook.finish(result)
    _communication_of_this_rank(hooks, result)
    if result.metrics.generation is not None:
        finding = classify_decode(result.metrics.generation, result.config, result.metrics.gpu, active=result.levers)
        result.metrics.generation.decode_regime = finding.to_dict() if finding is not None else None
    if in_rank():
        from perflab.distributed.gather import gather_result  # collectives: only inside a rank
        result = gather_result(result, checksum)
    return result


def _replica_checksum(plan: StepPlan, cfg: RunConfig) -> Optional[float]:
    """In a DDP training rank, its weights' checksum: rank 0 compares them (a lever that stops the all-reduce makes
    the replicas differ, perflab/distributed/replicas.py); None elsewhere (FSDP's ranks hold different shards)."""
    if not in_rank() or cfg.parallel != "ddp" or cfg.mode != "train":
        return None
    from perflab.distributed.replicas import weights_checksum  # distributed: only inside a rank
    return weights_checksum(plan.model)


@contextmanager
def out_of_memory_as_result(cfg: RunConfig, device: torch.device, command: Optional[Sequence[str]],
                            advise: bool = True) -> Iterator[None]:
    """An out-of-memory inside becomes a result: its record (perflab.oom) saved as result.json with status
    "oom" in cfg.out when there is one, the cache freed, and OutOfMemoryFailure raised (the CLI prints its block
    and exits 3); the original error stays its cause, for --debug. With `advise` (and where one process runs the
    workload), the failure asks with_breakdown_advice, around the caller, for advice from a breakdown at a smaller
    batch."""
    try:
        yield
    except OutOfMemoryFailure:
        raise
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        record = OutOfMemory.from_error(err, device, cfg)
        free_after(err)
        _save_out_of_memory(record, cfg, device, command)
        raise record.failure(advise and breakdown_advice_wanted(cfg)) from err  # with_breakdown_advice gives it


@contextmanager
def with_breakdown_advice(cfg: RunConfig, device: torch.device, command: Optional[Sequence[str]]) -> Iterator[None]:
    """Around a whole run, outside the frames that ran out of memory: once those have finished, what they held can
    be let go of (inside them, the frame that holds the plan is still executing), and the advice of an OOM that asks
    for it comes from a breakdown at a smaller batch (perflab/memory/advice.py); result.json is saved again."""
    try:
        yield
    except OutOfMemoryFailure as failure:
        if not failure.advise:
            raise
        free_after(failure)
        from perflab.memory.advice import advice_from_breakdown  # memory/ profiles through this module
        record = OutOfMemory.from_dict(failure.record)
        record.advice = advice_from_breakdown(cfg, record.total_mb) or record.advice
        _save_out_of_memory(record, cfg, device, command)
        raise record.failure() from failure.__cause__


def _save_out_of_memory(record: OutOfMemory, cfg: RunConfig, device: torch.device,
                        command: Optional[Sequence[str]]) -> None:
    if cfg.out and is_primary():
        new_result(cfg, device, {"name": cfg.workload}, command, status="oom",
                   status_reason=record.summary(), out_of_memory=record.to_dict()).save(cfg.out)


def breakdown_advice_wanted(cfg: RunConfig) -> bool:
    """One process runs a workload at a batch that can be halved, and PERFLAB_OOM_BREAKDOWN is not 0."""
    return (os.environ.get(OOM_BREAKDOWN_ENV, "1") != "0" and not in_rank() and cfg.nproc == 1
            and bool(cfg.workload) and (cfg.batch_size or 0) >= 2)


def _communication_of_this_rank(hooks: Sequence[StepHook], result: Result) -> None:
    """In a rank of a profiled multi-GPU run, its NCCL time and exposed share from its own trace (it may be on another
    node), before rank 0 gathers the figures."""
    for hook in hooks:
        if isinstance(hook, ProfilerCapture) and hook.written and hook.distributed and hook.cuda:
            profile = communication_profile(load_trace(hook.trace_path))
            result.metrics.collectives = profile.to_dict() if profile is not None else None


def _status(interrupted: Optional[str], non_finite: Optional[str]) -> tuple[str, str]:
    """complete | interrupted | invalid, and why."""
    if interrupted:
        return "interrupted", interrupted
    if non_finite:
        return "invalid", non_finite
    return "complete", ""


def _launch(workload: Union[Workload, str, None], cfg: RunConfig, command_name: str,
            recorded: Optional[list[str]], extra_argv: Sequence[str] = ()) -> Optional[Result]:
    """Start cfg.nproc ranks of `perflab <command_name>` writing to cfg.out (a temporary directory when unset)."""
    import tempfile

    from perflab.distributed.launch import launch  # torchrun's launcher, only for a multi-process run

    if isinstance(workload, Workload):
        raise PerflabError(f"--nproc {cfg.nproc}: each rank builds the workload itself, so give a spec (a built-in "
                           "name, path/file.py:build or package.module:build), not a Workload object")
    if cfg.out:
        return launch(cfg, command_name, Path(cfg.out), extra_argv, recorded_command=recorded)
    with tempfile.TemporaryDirectory(prefix="perflab-ranks-") as out:
        return launch(cfg, command_name, Path(out), extra_argv, recorded_command=recorded)


def profile_run(workload, cfg: RunConfig, out_dir: Union[str, Path], options: Optional[CaptureOptions] = None,
                reporter: Optional[Reporter] = None, command: Optional[list[str]] = None):
    """Run with a profiler capture, save result.json, trace, diagnosis.json and nsys_command.txt in `out_dir`.

    `workload` is a Workload or a spec; every field of `cfg` applies (checkpoints, --nsys included), and the
    nsys command reproduces it. `command` is what is recorded as the run's command line.
    Returns (result, diagnosis or None, nsys command as a list).
    """
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
        result = _launch(workload, cfg, "profile", command, capture_argv(options))
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

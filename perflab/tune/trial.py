"""One trial: `python -m perflab run|profile|serve ... --out DIR` in its own process, timed and classified.

A cold trial runs in a child process so that compile caches, CUDA errors and out-of-memory states die with it; tune's
default runner (perflab/tune/warm.py) sends most trials to one warm worker process instead, which runs the same
arguments and is classified here the same way. Its whole wall time (interpreter start, workload build, compilation,
warm-up, timed steps, quality gate) is what the budget is charged. The trial's output goes to DIR.log beside the run
folder (a run refuses a folder holding files it did not write).
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.oom import OOM_BREAKDOWN_ENV, OutOfMemory
from perflab.profile.capture import CaptureOptions, capture_argv
from perflab.quality import baseline_cache
from perflab.results import RESULT_FILE, Result
from perflab.results.quality import verdict_of
from perflab.serve.config import ServeConfig
from perflab.tune.objective import serve_argv, serve_figures

LOG_SUFFIX = ".log"
GATE_BASELINES_DIR = "gate-baselines"  # in the tune directory: the quality gate's fp32 baselines, shared
COMPILE_CACHE_DIR = "compile-cache"  # in the tune directory: Inductor, FX-graph and AOTAutograd caches, shared
REFUSED_EXIT = 2  # perflab's exit code for a user mistake; "refused" in the message marks a lever refusal
QUALITY_FAILED_EXIT = 1  # `perflab run` (and serve) saves the result and exits 1 when the quality gate fails
INTERRUPTED_EXITS = (130, -2)  # the child was interrupted (Ctrl-C reaches the whole process group)
# The profile a tune records: a short schedule inside the first (only) trial.
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 3
PROFILE_STEPS = PROFILE_WAIT + PROFILE_WARMUP + PROFILE_ACTIVE  # a profile trial's timed steps

OK, QUALITY_FAIL, REFUSED, OOM, ERROR = "ok", "quality-fail", "refused", "oom", "error"
TIMEOUT = "timeout"  # killed at its time limit: the budget it could use when it began
INVALID = "invalid"  # the run finished but its numbers cannot be used (NaN/inf, or DDP replicas that differ)


@dataclass
class TrialOutcome:
    """What a trial produced: its status, the saved result (when there is one) and what it cost."""

    status: str  # ok | quality-fail | refused | oom | error
    wall_s: float
    reason: str = ""
    result: Optional[Result] = None
    files: dict[str, str] = field(default_factory=dict)
    warm: bool = False  # run by tune's warm worker (perflab/tune/warm.py), not in a process of its own
    setup_s: Optional[float] = None  # of wall_s, the warm worker's start this trial paid (None: it paid none)

    @property
    def measured(self) -> bool:
        return self.result is not None


def lengthened(cfg: RunConfig, factor: float) -> RunConfig:
    """`cfg` with each trial `factor` times as long: its timed steps and its --min-trial-s (the one lengthens a
    step-bound trial, the other a loader-fed one)."""
    if factor == 1.0:
        return cfg
    return cfg.replace(steps=math.ceil(cfg.steps * factor), min_trial_s=cfg.min_trial_s * factor)


def profile_capture(steps: int) -> CaptureOptions:
    """The profiler schedule of a tune's profile trial, fitted inside `steps` timed steps."""
    active = max(1, min(PROFILE_ACTIVE, steps - PROFILE_WAIT - PROFILE_WARMUP))
    wait = min(PROFILE_WAIT, max(0, steps - active - PROFILE_WARMUP))
    warmup = max(0, min(PROFILE_WARMUP, steps - active - wait))
    return CaptureOptions(wait=wait, warmup=warmup, active=active)



def trial_argv(cfg: RunConfig, kind: str, out: Path, serve: Optional[ServeConfig] = None) -> list[str]:
    """perflab's arguments for a trial: `run|profile <cfg's options> --out DIR`, or `serve` with the options serve
    takes and the serve settings (a cold trial's process and the warm worker both run these)."""
    if kind == "serve":
        return [kind, *serve_argv(cfg, serve or ServeConfig()), "--out", str(out)]
    argv = [kind, *cfg.to_argv(kind)]
    if kind == "profile":
        argv += capture_argv(profile_capture(cfg.steps))
    return argv + ["--out", str(out)]


def trial_command(cfg: RunConfig, kind: str, out: Path, serve: Optional[ServeConfig] = None) -> list[str]:
    """The child's command line: `python -m perflab` and the trial's arguments."""
    return [sys.executable, "-m", "perflab", *trial_argv(cfg, kind, out, serve)]


def fresh_out(out: Path) -> None:
    """An empty place for a trial's run folder: one left by a trial interrupted before it was recorded is removed."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)


def compile_cache_dir(out: Path) -> Path:
    """The compile caches every trial of a tune shares: in the tune directory (`out`'s grandparent)."""
    return out.parent.parent / COMPILE_CACHE_DIR


def log_path(out: Path) -> Path:
    """Where a trial's output goes: beside its run folder."""
    return out.with_name(out.name + LOG_SUFFIX)


def compile_cache_env(cache_dir: Path, environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of a trial process: every trial of a tune shares one Inductor cache directory with the
    FX-graph and AOTAutograd caches on, so a configuration compiled before compiles again in seconds. A user's own
    TORCHINDUCTOR_CACHE_DIR is kept."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    env[OOM_BREAKDOWN_ENV] = "0"  # a trial's OOM is an outcome tune reads, not advice: no breakdown at half the batch
    # every gated training trial trains the same fp32 eager baseline: the first stores it for the others
    env[baseline_cache.CACHE_ENV] = str(cache_dir.parent / GATE_BASELINES_DIR)
    return env


def run_trial(cfg: RunConfig, kind: str, out: Path, time_limit_s: Optional[float] = None,
              serve: Optional[ServeConfig] = None) -> TrialOutcome:
    """Run one trial in a fresh process and classify how it ended; KeyboardInterrupt if it was interrupted.
    With `time_limit_s`, a child still running then is killed and the trial is a TIMEOUT; `serve`: the settings
    of a serve trial. The compile caches live in the tune directory (`out`'s grandparent)."""
    fresh_out(out)
    command = trial_command(cfg, kind, out, serve)
    began = time.perf_counter()
    with open(log_path(out), "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        # subprocess.run kills the child if this process is interrupted while waiting for it, or at the limit.
        try:
            finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=time_limit_s, env=compile_cache_env(compile_cache_dir(out)))
        except subprocess.TimeoutExpired:
            return stopped_at_limit(kind, out, time_limit_s, began)
    return finished_trial(finished.returncode, out, time.perf_counter() - began)


def finished_trial(returncode: int, out: Path, wall_s: float, warm: bool = False) -> TrialOutcome:
    """The outcome of a trial that ended with `returncode` (its process's, or the warm worker's answer for it);
    KeyboardInterrupt if it was interrupted."""
    if returncode in INTERRUPTED_EXITS:
        raise KeyboardInterrupt
    outcome = classify(returncode, log_path(out).read_text(errors="replace"), out, wall_s)
    outcome.warm = warm
    return outcome


def stopped_at_limit(kind: str, out: Path, time_limit_s: Optional[float], began: float,
                     warm: bool = False) -> TrialOutcome:
    """The outcome of a trial killed at its time limit: TIMEOUT, unless its result was saved whole first."""
    saved = _measured_before_the_limit(kind, out)
    if saved is not None:  # stopped while printing or exiting: the measurement itself is whole
        return finished_trial(saved, out, time.perf_counter() - began, warm)
    return TrialOutcome(TIMEOUT, time.perf_counter() - began, f"stopped after {time_limit_s:.0f} s, its time "
                        "limit (the budget it could use when it began)", files={"log": log_path(out).name}, warm=warm)


def _measured_before_the_limit(kind: str, out: Path) -> Optional[int]:
    """The exit code a `perflab run` trial stopped at its time limit would have given, when its result was saved
    whole first (saved last, atomically; only the printing and the interpreter's exit were cut); None otherwise. A
    profile trial saves its result before its trace is written and diagnosed: never whole at the limit."""
    if kind != "run" or not (out / RESULT_FILE).is_file():
        return None
    try:
        result = Result.load(out)
    except PerflabError:
        return None
    if getattr(result, "status", "complete") not in ("complete", INVALID) or not result.trials:
        return None
    return QUALITY_FAILED_EXIT if verdict_of(result.quality) == "fail" else 0


def classify(returncode: int, log: str, out: Path, wall_s: float) -> TrialOutcome:
    """ok, quality-fail, invalid, refused, oom or error, from the exit code, the log and what was saved."""
    result = Result.load(out) if (out / RESULT_FILE).is_file() else None
    files = {"log": log_path(out).name, **({"result": RESULT_FILE} if result is not None else {})}
    if result is not None and getattr(result, "status", "complete") == INVALID:
        return TrialOutcome(INVALID, wall_s, getattr(result, "status_reason", "") or "invalid run", files=files)
    if returncode == 0 and result is not None:
        return TrialOutcome(OK, wall_s, result=result, files=files)
    if returncode == QUALITY_FAILED_EXIT and result is not None:
        reason = result.quality.reason if result.quality is not None else "the quality gate failed"
        return TrialOutcome(QUALITY_FAIL, wall_s, reason, result, files)
    if result is not None and getattr(result, "out_of_memory", None):  # the run recorded its OOM (status oom)
        return TrialOutcome(OOM, wall_s, OutOfMemory.from_dict(result.out_of_memory).summary(), files=files)
    message = error_line(log)
    if "out of memory" in log.lower():
        return TrialOutcome(OOM, wall_s, message or "out of memory", files=files)
    if returncode == REFUSED_EXIT and "refused" in message:
        return TrialOutcome(REFUSED, wall_s, message, files=files)
    return TrialOutcome(ERROR, wall_s, message or f"exit code {returncode}", files=files)


def error_line(log: str) -> str:
    """The child's one-line error (perflab's `error: ...`), or the last line of a traceback."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line.removeprefix("error:").strip()
    return lines[-1] if lines else ""


def trial_figures(outcome: TrialOutcome) -> dict[str, Any]:
    """What tune.jsonl records of a trial beside its status: whether it ran warm, and its numbers (throughput with
    its interval, latency, memory, costs; a serve trial's max QPS)."""
    return {"warm": outcome.warm, "setup_s": outcome.setup_s, **_measured_figures(outcome)}


def _measured_figures(outcome: TrialOutcome) -> dict[str, Any]:
    if outcome.result is None:
        return {}
    metrics = outcome.result.metrics
    if metrics.serve is not None:
        return serve_figures(outcome.result)
    throughput, latency = metrics.throughput_samples_per_s, metrics.latency_ms
    return {"throughput": throughput.median, "throughput_ci95": [throughput.ci95_low, throughput.ci95_high],
            "p50_ms": latency.p50, "p99_ms": latency.p99,
            "peak_memory_mb": metrics.peak_memory.mb,
            "warmup_s": metrics.warmup_s, "compile_s": metrics.compile_s,
            "timed_s": sum(trial.wall_s for trial in outcome.result.trials),  # the measured window
            "mfu_pct": metrics.flops.mfu_pct if metrics.flops else None,
            "quality": verdict_of(outcome.result.quality, None)}

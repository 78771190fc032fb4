"""WarmRunner, tune's default runner: trials go to one warm worker process (perflab/tune/worker.py), not each to a
fresh `python -m perflab` process, so a trial no longer pays the interpreter, the torch import, the CUDA context and
the workload build again.

Some trials still run cold (perflab/tune/trial.py run_trial), in a process of their own: serve trials, and trials of a
lever declared `changes_process` (DataLoader workers and their queue, --nproc ranks): it starts processes of its own or
changes what a process keeps for good. The idle worker is ended first, so that on a GPU it is not the cold trial's
neighbour. A worker that ran out of memory, hit a CUDA error or crashed is replaced: its trial is recorded with the
status a cold trial would have (the same exit code, the same log), and the next trial starts a new worker. At a
trial's time limit the worker is killed (its process group) and the trial is a TIMEOUT, as a cold one. The worker ends
with the runner (a `with` block, or close()), and with this process however it ends.

The protocol is one JSON line each way: a WorkerRequest (perflab's arguments for the trial, and its log file) on the
worker's stdin, a WorkerReply (the exit code the CLI would have given, and whether the worker retires) on its stdout.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from perflab.config import RunConfig
from perflab.levers import process_changing_levers
from perflab.serve.config import ServeConfig
from perflab.tune.record import Runner
from perflab.tune.trial import (TrialOutcome, compile_cache_dir, compile_cache_env, finished_trial, fresh_out,
                                log_path, run_trial, stopped_at_limit, trial_argv)


@dataclass
class WorkerRequest:
    """Run perflab with `argv` (perflab.tune.trial.trial_argv), its output appended to `log`."""

    argv: list[str]
    log: str


@dataclass
class WorkerReply:
    """What `python -m perflab <argv>` would have exited with; retire: the worker is unfit for another trial (it
    exits)."""

    exit_code: int
    retire: bool
    trial_s: float = 0.0  # the worker's own time on the request: the trial less its start, when it started one


def encode(message: Any) -> bytes:
    return (json.dumps(asdict(message)) + "\n").encode()


def decode(kind: type, line: bytes) -> Any:
    return kind(**json.loads(line))


def runs_cold(cfg: RunConfig, kind: str) -> bool:
    """Whether a trial needs a process of its own: a serve trial, or a lever that changes the process."""
    return kind == "serve" or bool(process_changing_levers(cfg))


class Worker:
    """One started `python -m perflab.tune.worker`, in a process group of its own (killed whole)."""

    def __init__(self, cache_dir: Path, log: Path):
        with open(log, "a") as startup_log:  # what goes wrong while it starts is in the starting trial's log
            self.process = subprocess.Popen(
                [sys.executable, "-m", "perflab.tune.worker", "--parent-pid", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=startup_log, env=compile_cache_env(cache_dir),
                start_new_session=True)
        self.cache_dir = cache_dir
        self.pending = b""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: WorkerRequest, deadline: Optional[float]) -> Optional[WorkerReply]:
        """Send a trial and wait for its answer until `deadline` (time.monotonic; TimeoutError after it); None if the
        worker died first."""
        try:
            self.process.stdin.write(encode(request))
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        while b"\n" not in self.pending:
            chunk = self._read(deadline)
            if not chunk:
                return None
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return decode(WorkerReply, line)

    def _read(self, deadline: Optional[float]) -> bytes:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.process.stdout], [], [], left)
        if not ready:
            raise TimeoutError
        return os.read(self.process.stdout.fileno(), 65536)

    def exit_code(self) -> int:
        """How the worker ended (it has ended, or is ending: it is waited for)."""
        return self.process.wait()

    def kill(self) -> None:
        """End it and what it started, now."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


class WarmRunner:
    """A Runner (perflab.tune.record) that keeps one warm worker for the trials that can run in it."""

    def __init__(self, cold: Runner = run_trial):
        self.cold = cold
        self.worker: Optional[Worker] = None

    def __enter__(self) -> "WarmRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the worker (the next warm trial starts a new one)."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def __call__(self, cfg: RunConfig, kind: str, out: Path, time_limit_s: Optional[float] = None,
                 serve: Optional[ServeConfig] = None) -> TrialOutcome:
        if runs_cold(cfg, kind):
            self.close()
            return self.cold(cfg, kind, out, time_limit_s=time_limit_s, serve=serve)
        try:
            return self._run_warm(cfg, kind, Path(out), time_limit_s)
        except BaseException:  # interrupted: the worker goes with the trial
            self.close()
            raise

    def _run_warm(self, cfg: RunConfig, kind: str, out: Path, time_limit_s: Optional[float]) -> TrialOutcome:
        fresh_out(out)
        began = time.perf_counter()
        deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        argv = trial_argv(cfg, kind, out)
        log_path(out).write_text("$ perflab " + " ".join(argv) + "  # in tune's warm worker\n")
        before = self.worker
        worker = self._worker_for(out)
        starting = worker is not before
        try:
            reply = worker.ask(WorkerRequest(argv, str(log_path(out))), deadline)
        except TimeoutError:
            self.close()
            return stopped_at_limit(kind, out, time_limit_s, began, warm=True)
        if reply is None or reply.retire:  # it died in the trial, or is exiting: unfit for another
            exit_code = worker.exit_code() if reply is None else reply.exit_code
            self.close()
        else:
            exit_code = reply.exit_code
        outcome = finished_trial(exit_code, out, time.perf_counter() - began, warm=True)
        if starting and reply is not None and reply.trial_s:
            outcome.setup_s = max(0.0, outcome.wall_s - reply.trial_s)  # the interpreter, torch, CUDA: once a worker
        return outcome

    def _worker_for(self, out: Path) -> Worker:
        """The running worker, or a new one (its start is the trial's time); one per tune directory's compile cache."""
        cache_dir = compile_cache_dir(out)
        if self.worker is not None and (not self.worker.alive or self.worker.cache_dir != cache_dir):
            self.close()
        if self.worker is None:
            self.worker = Worker(cache_dir, log_path(out))
        return self.worker

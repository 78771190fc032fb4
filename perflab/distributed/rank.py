"""Inside a rank: the process group, the device of LOCAL_RANK, and how a failure reaches the launcher.

A rank is `python -m perflab <command> ... --nproc-rank-mode` started by torchrun's launcher, which sets
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT and TORCHELASTIC_ERROR_FILE. A rank that fails writes its
error (message and traceback) to that file instead of its stderr: the launcher reads every rank's file and
prints the first failure once (perflab/distributed/launch.py), so a peer's follow-on error ("connection
closed") never buries the cause.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn, Optional

import torch
import torch.distributed as dist

from perflab.errors import PerflabError, WorkloadExited, exit_message
from perflab.ranks import LAUNCHER_PID_ENV

RANK_MODE_FLAG = "--nproc-rank-mode"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
TIMEOUT_ENV = "PERFLAB_RANK_TIMEOUT_S"  # --rank-timeout, set by the launcher for its ranks
DEFAULT_TIMEOUT_S = 300.0


def rank_timeout_s() -> float:
    """How long a collective waits for the other ranks (--rank-timeout, passed by the launcher)."""
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


class RankStalledError(PerflabError):
    """A collective waited --rank-timeout seconds for a rank that never joined it."""


def local_rank() -> int:
    """This rank's index on its node (torchrun's LOCAL_RANK): its GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


@contextlib.contextmanager
def process_group(device: str) -> Iterator[None]:
    """init_process_group from torchrun's environment: NCCL with this rank's GPU on CUDA, gloo on CPU."""
    if "RANK" not in os.environ:
        raise PerflabError(f"{RANK_MODE_FLAG} is for the ranks perflab starts; run `perflab run --nproc N` instead")
    if device == "cuda":
        torch.cuda.set_device(local_rank())  # before anything touches CUDA: the harness uses current_device()
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=rank_timeout_s()))
    try:
        yield
    finally:
        dist.destroy_process_group()


ORPHAN_POLL_S = 0.5


def exit_when_orphaned(poll_s: float = ORPHAN_POLL_S) -> None:
    """End this rank once its launcher is gone (killed with SIGKILL, it cannot stop its ranks): a daemon thread
    watches the parent pid, and an orphaned rank exits instead of running on for the rest of the run. The launcher's
    pid comes from the environment: a rank orphaned while it was still starting has the wrong parent already."""
    parent = int(os.environ.get(LAUNCHER_PID_ENV) or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)  # noqa: SLF001 - no cleanup to wait for: nobody reads this rank's output any more
    threading.Thread(target=watch, daemon=True, name="perflab-orphan-watch").start()


def run_as_rank(device: str, body: Callable[[], None]) -> NoReturn:
    """The whole life of a rank: group up, `body`, group down, and the process ends here (`leave`). The exit code:
    0, or a failure written to the launcher's error file (2 for a user mistake, 1 for anything else)."""
    exit_when_orphaned()
    leave(_rank_life(device, body))


def leave(code: int) -> NoReturn:
    """End the rank without Python's finalization. A gloo worker thread drops its last collective (the result's
    gather) a moment after the main thread saw it complete; when that came during finalization, its tensors' decref
    could not take the GIL, the thread was unwound through a noexcept frame and the rank died of SIGABRT
    ("terminate called without an active exception", 1 CI run in 15). Everything a rank writes is written and
    flushed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # noqa: SLF001 - see the docstring


def _rank_life(device: str, body: Callable[[], None]) -> int:
    try:
        with process_group(device):
            body()
        return 0
    except BaseException as err:  # noqa: B902 - every failure must reach the launcher, KeyboardInterrupt too
        if is_collective_timeout(err):
            try:
                raise RankStalledError(f"waited {rank_timeout_s():g} s (--rank-timeout) for the other ranks in a "
                                       "collective: a rank stalled (a hang in its forward, data or a deadlock); the "
                                       "run was stopped; raise --rank-timeout if a rank legitimately works that "
                                       "long alone") from err
            except RankStalledError as stalled:
                record_failure(stalled)
            return 1
        if isinstance(err, (SystemExit, WorkloadExited)):
            err = _exited(err)
        record_failure(err)
        return getattr(err, "exit_code", 2) if isinstance(err, PerflabError) else 1  # 3: out of memory


class RankExitedError(PerflabError):
    """The workload's code ended its rank (sys.exit, os._exit(0)) while the other ranks went on."""


def _exited(err: BaseException) -> RankExitedError:
    """A rank's sys.exit or os._exit(0), as one line saying where in the user's code it was called."""
    return RankExitedError(exit_message(err, ends="this rank alone while the others wait for it"))


def is_collective_timeout(err: BaseException) -> bool:
    """A gloo or NCCL collective that gave up waiting for the other ranks."""
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


@dataclass
class RankError:
    """A failed rank's error, as torch.distributed.elastic's error file holds it ({"message", "extraInfo"}: the
    launcher reads it as the failure's message) with perflab's figures in extraInfo; keys a file lacks (one torch
    wrote itself) take their defaults."""

    message: str = ""
    py_callstack: str = ""
    timestamp: str = ""  # whole seconds: the format's own
    time_ns: Optional[int] = None  # which rank failed first
    perflab_error: bool = False
    rank_stalled: bool = False
    exit_code: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        info = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "message"}
        return {"message": self.message, "extraInfo": info}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Optional[RankError]:
        """None for an empty message (no error file was written)."""
        if not data:
            return None
        info = data.get("extraInfo") or {}
        return cls(message=str(data.get("message") or ""),
                   **{name: info[name] for name in cls.__dataclass_fields__ if name in info and name != "message"})


def record_failure(err: BaseException) -> None:
    """Write the error in torch.distributed.elastic's error-file format, with a nanosecond time so that the
    launcher can tell which rank failed first (the format's own timestamp is in whole seconds)."""
    error = RankError(message=f"{type(err).__name__}: {err}", py_callstack=traceback.format_exc(),
                      timestamp=str(int(time.time())), time_ns=time.time_ns(),
                      perflab_error=isinstance(err, PerflabError), rank_stalled=isinstance(err, RankStalledError),
                      exit_code=getattr(err, "exit_code", 2) if isinstance(err, PerflabError) else 1)
    data = {"message": error.to_dict()}
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:  # started by hand, not by the launcher: say it here
        if isinstance(err, PerflabError):
            print(f"error: {err}", file=sys.stderr)
        else:
            traceback.print_exc()
        return
    # Written whole, then renamed into place: the launcher reads the file of every failed rank as soon as it sees
    # it exit, and a rank killed (or read) between open() and the dump left it empty, which torch's launcher
    # cannot parse (JSONDecodeError inside torchrun, seen in CI when the surviving rank failed too).
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as stream:
        json.dump(data, stream)
    os.replace(partial, path)

"""Inside a rank: the process group, the device of LOCAL_RANK, and how a failure reaches the launcher.

A rank is `python -m perflab <command> ... --nproc-rank-mode` started by torchrun's launcher, which sets
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT and TORCHELASTIC_ERROR_FILE. A rank that fails writes its
error (message and traceback) to that file instead of its stderr: the launcher reads every rank's file and
prints the first failure once (perflab/distributed/launch.py), so a peer's follow-on error ("connection
closed") never buries the cause.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from perflab.errors import PerflabError

RANK_MODE_FLAG = "--nproc-rank-mode"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


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
    dist.init_process_group(backend)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_as_rank(device: str, body: Callable[[], None]) -> int:
    """The whole life of a rank: group up, `body`, group down. Returns the exit code; a failure goes to the
    launcher's error file (2 for a user mistake, 1 for anything else)."""
    try:
        with process_group(device):
            body()
        return 0
    except BaseException as err:  # noqa: B902 - every failure must reach the launcher, KeyboardInterrupt too
        record_failure(err)
        return getattr(err, "exit_code", 2) if isinstance(err, PerflabError) else 1  # 3: out of memory


def record_failure(err: BaseException) -> None:
    """Write the error in torch.distributed.elastic's error-file format, with a nanosecond time so that the
    launcher can tell which rank failed first (the format's own timestamp is in whole seconds)."""
    data = {"message": {"message": f"{type(err).__name__}: {err}",
                        "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time())),
                                      "time_ns": time.time_ns(), "perflab_error": isinstance(err, PerflabError),
                                      "exit_code": getattr(err, "exit_code", 2) if isinstance(err, PerflabError) else 1}}}
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

"""tune's warm worker: one process per tune that imports torch once, then runs trial after trial.

    python -m perflab.tune.worker --parent-pid PID

Each trial is what `python -m perflab run|profile ... --out DIR` runs in a process of its own (perflab.cli.main on
the same arguments): the same run folder, the same log, the same exit code. Between trials the worker keeps the
interpreter, torch, the CUDA context, the compile caches and the workload it built (perflab/workloads/reuse.py), and
puts back what a trial may change for the whole process: torch.compile's graphs, the backend switches, the memory.

Protocol (perflab/tune/warm.py): a WorkerRequest per JSON line on stdin, a WorkerReply per JSON line on the stdout it
started with; a trial's output goes to its log file, and between trials nothing is printed. A trial that leaves the
process unfit for another (out of memory, a CUDA error, an exception perflab did not catch) is answered with
retire=True, and the worker exits. It ends at the end of its input, or with the process that started it, however that
ends (Linux).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from perflab.tune.trial import QUALITY_FAILED_EXIT, REFUSED_EXIT
from perflab.tune.warm import WorkerReply, WorkerRequest, decode, encode
from perflab.workloads.reuse import reusing_builds

PR_SET_PDEATHSIG = 1  # prctl(2)
KEEPS_THE_WORKER = (0, QUALITY_FAILED_EXIT, REFUSED_EXIT)  # exit codes after which the process is still fit


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process when its parent ends, even by SIGKILL (Linux; elsewhere the end of input
    ends it, between trials)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent ended before the request above
        os._exit(0)


def run_perflab(argv: list[str]) -> tuple[int, bool]:
    """The exit code of `python -m perflab <argv>`, run here; True with it when an exception escaped perflab's CLI (a
    bug, or a fatal error: Python's traceback is printed, as that process would print it, and it exits 1)."""
    from perflab.cli import main as perflab_main  # the CLI imports perflab.tune: a module-level import is a cycle
    try:
        return perflab_main(argv), False
    except SystemExit as exit:
        code = exit.code
        if code is None or isinstance(code, int):
            return code or 0, False
        print(code, file=sys.stderr)
        return 1, False
    except BaseException:
        traceback.print_exc()
        return 1, True


@contextmanager
def output_to(log_path: str, quiet_fd: int) -> Iterator[None]:
    """Inside, this process's stdout and stderr (Python's and the C libraries') append to `log_path`; after, to
    `quiet_fd` (nothing may reach the reply pipe)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(quiet_fd, 1)
            os.dup2(quiet_fd, 2)


Switch = tuple[Callable[[], Any], Callable[[Any], None]]  # (read, write)


def torch_switches() -> dict[str, Switch]:
    """The process-wide torch settings a lever (perflab/backends.py, levers/cudnn.py, levers/sdpa.py), a plan or the
    user's code may change, each with how to read and write it."""
    import torch
    cudnn, cuda = torch.backends.cudnn, torch.backends.cuda

    def attribute(owner: Any, name: str) -> Switch:
        return (lambda: getattr(owner, name)), (lambda value: setattr(owner, name, value))
    switches = {
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "cuda.matmul.allow_tf32": attribute(cuda.matmul, "allow_tf32"),
        "cudnn.allow_tf32": attribute(cudnn, "allow_tf32"),
        "cudnn.benchmark": attribute(cudnn, "benchmark"),
        "cudnn.deterministic": attribute(cudnn, "deterministic"),
        "deterministic_algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
        "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "num_threads": (torch.get_num_threads, torch.set_num_threads),
    }
    for kernel in ("flash", "mem_efficient", "math", "cudnn"):  # the SDPA backends allowed
        if hasattr(cuda, f"{kernel}_sdp_enabled"):
            switches[f"sdpa.{kernel}"] = (getattr(cuda, f"{kernel}_sdp_enabled"), getattr(cuda, f"enable_{kernel}_sdp"))
    return switches


def read_switches() -> dict[str, Any]:
    """The torch switches' values now (as the worker starts). A switch torch will not report (the user's code mixed
    the legacy and the per-backend TF32 APIs, and the legacy getter raises) is left out, and is not put back."""
    values = {}
    for name, (read, _) in torch_switches().items():
        try:
            values[name] = read()
        except RuntimeError:
            continue
    return values


def reset_between_trials(start: dict[str, Any]) -> None:
    """Put the process back as the worker started: no compiled graphs (the compile caches on disk stay), the
    switches' values, no garbage, the CUDA cache emptied. Only a switch that changed is written: writing a legacy
    TF32 switch also sets the per-backend precision flags (see perflab/backends.py `set_tf32`)."""
    import torch
    torch._dynamo.reset()
    for name, (read, write) in torch_switches().items():
        if name not in start:
            continue
        try:
            unchanged = read() == start[name]
        except RuntimeError:
            unchanged = False
        if not unchanged:
            write(start[name])
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def device_is_healthy() -> bool:
    """False after a CUDA error, which stays with the context (every later call fails)."""
    import torch
    if not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def run_request(request: WorkerRequest, start: dict[str, Any], quiet_fd: int) -> WorkerReply:
    """One trial, then the process put back (or retired)."""
    began = time.perf_counter()
    with output_to(request.log, quiet_fd):
        exit_code, escaped = run_perflab(request.argv)
    retire = escaped or exit_code not in KEEPS_THE_WORKER or not device_is_healthy()
    if not retire:
        reset_between_trials(start)
    return WorkerReply(exit_code, retire, round(time.perf_counter() - began, 3))


def answer_requests(requests: Any, replies: Any, quiet_fd: int) -> None:
    """Answer requests until the end of input or a trial that retires the worker."""
    start = read_switches()
    with reusing_builds():
        for line in iter(requests.readline, b""):
            reply = run_request(decode(WorkerRequest, line), start, quiet_fd)
            replies.write(encode(reply))
            replies.flush()
            if reply.retire:
                return


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.tune.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    replies = os.fdopen(os.dup(1), "wb")
    import perflab.cli  # noqa: F401  every command, once, now (into the starting trial's log); module level: a cycle
    quiet_fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet_fd, 1)
    os.dup2(quiet_fd, 2)
    answer_requests(sys.stdin.buffer, replies, quiet_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())

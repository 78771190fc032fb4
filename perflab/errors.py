"""The one exception type for user mistakes; the CLI prints it as one line and exits 2.

`UserCodeError` is the kind raised when the user's own code (build, dataset, forward, loss) fails: it says
what perflab was doing, the exception, and only the frames of the user's files (`--debug` shows them all).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

_OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
                     torch.cuda.OutOfMemoryError})


class PerflabError(Exception):
    """A problem with the user's input or environment, with a message that says what to do."""


class UserCodeError(PerflabError):
    """The user's code raised while perflab was `doing` something; carries the user's own frames."""

    def __init__(self, doing: str, error: BaseException, frames=None):
        from perflab.user_frames import exception_summary, user_frames  # user_frames imports perflab

        self.doing = doing
        self.error = error
        self.frames = user_frames(error) if frames is None else list(frames)
        self.summary = exception_summary(error)
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [f"{self.doing} raised {self.summary}"]
        if self.frames:
            lines.append("  in your code (most recent call last):")
            lines += [f"    {frame}" for frame in self.frames]
        else:
            lines.append("  (no frame of it is in your own files)")
        lines.append("  run with --debug (or PERFLAB_DEBUG=1) for the full traceback")
        return "\n".join(lines)


EXIT_OUT_OF_MEMORY = 3  # the exit code of a run that did not fit in memory (docs/memory.md)
# the CPU allocator's words for the same thing ("DefaultCPUAllocator: can't allocate memory: ...")
# cuBLAS and cuDNN report a device that is full through their own status when they create a handle or workspace
_OOM_WORDS = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


class OutOfMemoryFailure(PerflabError):
    """A run that did not fit in memory, as a result: its message is the short block (what was being allocated,
    the figures, the batch and levers, what would make it fit); `record` is perflab.oom's dictionary."""

    exit_code = EXIT_OUT_OF_MEMORY

    def __init__(self, message: str, record: dict, advise: bool = False):
        self.record = record
        self.advise = advise  # its advice is still to come from a breakdown (perflab.pipeline.with_breakdown_advice)
        super().__init__(message)


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError, the RuntimeError older code paths (and the CPU allocator) raise, or perflab's
    OutOfMemoryFailure."""
    if isinstance(err, (OutOfMemoryFailure, *_OOM_ERRORS)):
        return True
    return isinstance(err, RuntimeError) and any(words in str(err) for words in _OOM_WORDS)


def is_users_fault(err: BaseException) -> bool:
    """Whether an exception out of the user's code is that code's failure. Running out of memory is not (a
    sweep records it as a point's outcome), and a PerflabError already says what is wrong."""
    return not (is_out_of_memory(err) or isinstance(err, (MemoryError, PerflabError)))


def os_error_line(err: OSError, what: str = "", target: object = None) -> str:
    """One line for a file-system error: the path it hit (the error's own, else `target`) and the cause."""
    path = err.filename if err.filename is not None else target
    cause = err.strerror or str(err)
    where = f" to {path}" if path is not None else ""
    doing = f"cannot write {what}{where}" if what else (f"file-system error at {path}" if err.filename is not None
                                                        else f"cannot write{where}")
    return f"{doing}: {cause}; check the path (--out) and the free space there"


@contextmanager
def writing(target: object, what: str = "output") -> Iterator[None]:
    """Turn an OSError while writing `what` to `target` into one clear PerflabError line."""
    try:
        yield
    except OSError as err:
        raise PerflabError(os_error_line(err, what, target)) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: every command ends the same way on
    either (an interrupted result kept where there is one, the output folder unlocked and reusable)."""

    signal_name = "SIGTERM"


def interrupt_name(err: BaseException) -> str:
    """How a KeyboardInterrupt came: 'Ctrl-C' (SIGINT) or 'SIGTERM'."""
    return getattr(err, "signal_name", "Ctrl-C")


class WorkloadExited(BaseException):
    """The workload's code tried to end the process (os._exit) while perflab ran it. A BaseException, as SystemExit
    is, so that nothing between that code and the CLI reads it as the workload's own failure; the CLI prints its
    message as one line and exits 2."""

    exit_code = 2


def exit_message(err: BaseException, ends: str = "perflab before the command finished") -> str:
    """One line for the workload's code ending the process (os._exit(0) as WorkloadExited, or sys.exit): where it was
    called, what that `ends` (perflab, or one rank of several) and what to do."""
    if isinstance(err, WorkloadExited):
        return str(err)
    from perflab.user_frames import user_frames  # user_frames imports perflab

    frames = user_frames(err)
    where = f" at {frames[-1].file}:{frames[-1].line} in {frames[-1].function}" if frames else ""
    code = getattr(err, "code", None)
    return (f"your code called sys.exit({code!r}){where}, which ends {ends}; return or raise there instead (perflab "
            "stopped the command)")

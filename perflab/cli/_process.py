"""The perflab process itself, when `perflab` (or `python -m perflab`) runs a command: what a workload's code does to
the process can neither hide how the command ended nor keep the process running after it.

- SIGTERM ends a command as Ctrl-C does: an interrupted result kept where there is one, the folder unlocked.
- os._exit(0) in the workload's code (build, forward, loss) is one line and exit 2, with the output folder unlocked
  and cleaned as after any failure, not a silent exit 0. A non-zero os._exit is left as it is: it says it failed.
- Processes started under perflab and still running when the command ends are ended with it (perflab is their
  subreaper, so a daemonised grandchild is found too), with a note.
- Threads left running once the command has finished do not keep perflab alive: a note, then the process exits.

`perflab.cli.main(argv)` called from Python (tests, tune's warm worker) runs the command alone: that process is the
caller's to manage.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from rich.markup import escape

from perflab.errors import Terminated, WorkloadExited

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned descendants are re-parented to this process, not to init
CHILD_GRACE_S = 1.0  # how long a process ended with SIGTERM has before SIGKILL
THREAD_GRACE_S = 0.5  # how long threads still running after the command have to finish on their own
# Helpers that Python and torch start for themselves and end at exit: not the workload's processes.
OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "torch._inductor", "torch/_inductor")


def as_process(command: Callable[[], int], rank: bool = False) -> int:
    """Run `command` (the parsed command line's handler, returning an exit code) as this process's whole life; a rank
    only gets the os._exit guard (its launcher stops it with SIGTERM and it ends itself with os._exit)."""
    with exit_zero_guarded():
        if rank:
            return command()
        with ending_leftover_processes(), sigterm_as_interrupt():  # SIGTERM while ending them: the default
            code = command()
    return exit_despite_threads(code)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread, as SIGINT raises
    KeyboardInterrupt: the same paths keep an interrupted result and release the folder."""
    def interrupt(signum, frame) -> NoReturn:
        raise Terminated()
    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def exit_zero_guarded() -> Iterator[None]:
    """Inside, os._exit(0) called from the user's own files in this process raises WorkloadExited instead of ending
    it silently with a success code. Anything else (perflab's and torch's own calls, a forked child, a non-zero
    code) exits as asked."""
    from perflab.user_frames import is_user_file  # imports torch

    real_exit, owner = os._exit, os.getpid()

    def exit_checked(code: int) -> NoReturn:
        caller = sys._getframe(1)
        if code != 0 or os.getpid() != owner or not is_user_file(caller.f_code.co_filename):
            real_exit(code)
        message = (f"your code called os._exit(0) at {caller.f_code.co_filename}:{caller.f_lineno} in "
                   f"{caller.f_code.co_name}, which would end perflab with nothing saved and report success; "
                   "return or raise there instead (perflab stopped the command)")
        if threading.current_thread() is not threading.main_thread():  # the main thread is elsewhere: end here
            _say(f"[bold red]error:[/] {escape(message)}")
            real_exit(WorkloadExited.exit_code)
        raise WorkloadExited(message)
    os._exit = exit_checked
    try:
        yield
    finally:
        os._exit = real_exit


@contextmanager
def ending_leftover_processes() -> Iterator[None]:
    """Become the subreaper of everything started inside; on the way out, end what is still running, with a note."""
    _become_subreaper()
    try:
        yield
    finally:
        leftovers = [pid for pid in descendants(os.getpid()) if not _is_own_helper(pid)]
        if leftovers:
            names = ", ".join(f"{pid} ({_name(pid)})" for pid in leftovers[:5])
            end_processes(leftovers)
            _say(f"[yellow]note:[/] ended {len(leftovers)} process(es) still running when the command finished, "
                 f"started by the workload: {escape(names)}; a workload should end the processes it starts")


def exit_despite_threads(code: int) -> int:
    """`code`, or, where threads other than perflab's are still running after a short grace, a note naming them and
    an immediate exit with `code` (Python would wait for them forever)."""
    deadline = time.monotonic() + THREAD_GRACE_S
    for thread in _lingering_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    lingering = _lingering_threads()
    if not lingering:
        return code
    names = ", ".join(repr(thread.name) for thread in lingering[:5])
    _say(f"[yellow]note:[/] {len(lingering)} thread(s) still running after the command finished ({escape(names)}); "
         "perflab exits without waiting for them (a workload's threads should be daemon threads or joined)")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # noqa: SLF001 - a normal exit would join those threads, forever


def _lingering_threads() -> list[threading.Thread]:
    """Non-daemon threads still alive, other than the main thread and idle concurrent.futures workers (their pools
    are shut down at exit)."""
    return [thread for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
            and getattr(getattr(thread, "_target", None), "__module__", "") != "concurrent.futures.thread"]


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):  # not Linux: direct children are still found
        pass


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes under `root`, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    zombies = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        if fields[0] == "Z":
            zombies.add(int(entry.name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    _reap(zombies & set(found))
    return [pid for pid in found if pid not in zombies]


def end_processes(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL for those still running after CHILD_GRACE_S; reap the ones that are this process's."""
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + CHILD_GRACE_S
    while time.monotonic() < deadline and _reap(pids) < len(pids) and any(_alive(pid) for pid in pids):
        time.sleep(0.02)
    _signal_all([pid for pid in pids if _alive(pid)], signal.SIGKILL)
    _reap(pids)


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(pids) -> int:
    """Collect the exit status of those of `pids` that are this process's children and have ended; how many are."""
    reaped = 0
    for pid in pids:
        try:
            reaped += os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:  # not ours, or collected already
            reaped += not _alive(pid)
    return reaped


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _name(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def _is_own_helper(pid: int) -> bool:
    try:
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(helper in command for helper in OWN_HELPERS)


def _say(line: str) -> None:
    from perflab.cli import err_console  # this module is imported by perflab.cli's main
    err_console.print(line, highlight=False, soft_wrap=True)

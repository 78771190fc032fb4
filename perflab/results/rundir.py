"""Output folders (`--out`, default `runs/<timestamp>-<name>/`): claimed, locked and cleaned without ever touching
a file perflab did not write.

- `OWNED_NAMES` is the one declaration of what perflab writes into an output folder; everything else there is the
  user's and is never removed.
- A folder that holds a run is refused unless the caller overwrites it; an overwrite removes the old run's files
  only once the new command has finished (those it did not rewrite), so a bad option or a failing forward leaves
  the old run as it was. A folder holding no perflab output but other files is refused. The working directory,
  the home directory, a filesystem root and a git repository root are never an output folder.
- A folder is locked (`.perflab.lock`, fcntl.flock) for the whole command: a second writer is refused at once.
- If a run fails, a folder it created is removed, unless it holds work worth keeping: a Ctrl-C leaves every
  checkpoint and finished trial where it is.
- Temp files that a killed atomic write left behind (`.<name>.*.tmp`) are removed on the next use.
"""
from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Iterator, Optional

from perflab.errors import PerflabError
from perflab.workloads.plugin import is_plugin_spec, plugin_name

RUNS_ROOT = Path("runs")
RESULT_FILE = "result.json"
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".perflab.lock"
TEMP_PATTERN = ".*.tmp"
KEEP_ON_INTERRUPT = (CHECKPOINT_FILE, RESULT_FILE)
# Files that mark a directory as perflab's output: only such a directory may be overwritten.
OUTPUT_MARKERS = (RESULT_FILE, "compare.json", "sweep.json", "tune.json", CHECKPOINT_FILE)
# Every name (fnmatch pattern) perflab writes into an output folder: run, profile, serve, compare, sweep, scale, tune.
OWNED_NAMES = (
    RESULT_FILE, CHECKPOINT_FILE, "trace.json", "trace.json.gz", "trace.rank*.json", "trace.rank*.json.gz",
    "diagnosis.json", "nsys_command.txt", "nsys_run", "nsys.nsys-rep", "nsys.qdrep",
    "compare.json", "report.md", "report.html",
    "step_breakdown.png", "latency_hist.png", "throughput_vs_*.png", "latency_vs_*.png", "memory_vs_*.png",
    "per_rank_throughput_vs_nproc.png", "scaling_efficiency_vs_nproc.png", "serve_*.png", "tune_*.png",
    "sweep.json", "sweep.jsonl", "sweep.csv", "points", "scale.json", "scaling.csv",
    "tune.json", "tune.jsonl", "trials", "recipe.txt", "compile-cache",
    "top_ops.png", "torch_anti_patterns.json", "memory.json", "memory_snapshot.pickle", "memory_timeline.png",
    LOCK_FILE, TEMP_PATTERN,
)


def default_run_dir(name: str) -> Path:
    """runs/<timestamp>-<name>; a plugin spec (`path/to/file.py:build`) is named after its file or module."""
    name = plugin_name(name) if is_plugin_spec(name) else name
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return RUNS_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"


def out_path(out: Optional[str], name: str) -> Path:
    """--out, else runs/<timestamp>-<name>, as an absolute path: made absolute before any user code runs, so a
    build() or a script that changes the working directory does not move perflab's files (or its lock). An empty
    --out is refused, not read as no --out."""
    if out is not None and not str(out).strip():
        raise PerflabError("--out is empty; give a directory, or drop --out for the default runs/<timestamp>-<name>")
    return (Path(out).expanduser() if out else default_run_dir(name)).absolute()


def is_owned(name: str) -> bool:
    """Whether perflab writes an entry of this name into an output folder (OWNED_NAMES)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in OWNED_NAMES)


def remove_stale_temp_files(path: Path) -> None:
    """Temp files of atomic writes that a kill interrupted (they are never read)."""
    for temp in path.glob(TEMP_PATTERN):
        temp.unlink(missing_ok=True)


def check_out_path(path: Path) -> None:
    """Refuse folders that are never perflab's alone: the working directory, home, a filesystem root, a git root."""
    resolved = path.expanduser().resolve()
    try:
        home: Optional[Path] = Path.home().resolve()
    except (KeyError, RuntimeError):  # no HOME and no passwd entry
        home = None
    reasons = [(resolved == Path.cwd().resolve(), "is the current directory"),
               (resolved == home, "is your home directory"),
               (resolved.parent == resolved, "is a filesystem root"),
               ((resolved / ".git").exists(), "is the root of a git repository")]
    for refused, reason in reasons:
        if refused:
            raise PerflabError(f"--out {path} {reason}, where perflab's files would sit among yours; give a folder "
                               "of its own, e.g. --out runs/NAME")


@contextmanager
def out_lock(path: Path) -> Iterator[None]:
    """Hold `path`/.perflab.lock for the whole command; a second writer to the folder is refused at once (exit 2,
    naming the holder's pid). OSError (an unwritable folder) propagates."""
    lock_path = path / LOCK_FILE
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise PerflabError(f"--out {path} is in use by another perflab command (pid {holder} holds {lock_path}); "
                               "wait for it to finish, or choose another --out") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: take the new one
    try:
        _take_over(fd, lock_path)
        yield
    finally:
        with suppress(OSError):
            os.unlink(lock_path)  # before unlocking: a waiter that opened this file sees it is gone and retries
        os.close(fd)


def _take_over(fd: int, lock_path: Path) -> None:
    """Write this process's pid into the lock just taken. A pid already there is a holder that ended without
    removing the file (killed, or os._exit): the kernel released its lock, so it is stale, and a note says so."""
    left_by = os.pread(fd, 32, 0).decode(errors="replace").strip()
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if left_by:
        print(f"note: took over {lock_path}, left by pid {left_by}, which ended without releasing it",
              file=sys.stderr, flush=True)


def _stamp(entry: Path) -> tuple[int, int]:
    stat = entry.lstat()
    return stat.st_ino, stat.st_mtime_ns


def _recorded_status(path: Path) -> Optional[str]:
    try:
        return json.loads((path / RESULT_FILE).read_text()).get("status", "complete")
    except (OSError, ValueError, AttributeError):
        return None


def _continues(path: Path, resume_from: Optional[str]) -> bool:
    """True when `resume_from` points into `path` and `path` holds an interrupted run."""
    if not resume_from or _recorded_status(path) != "interrupted":
        return False
    source = Path(resume_from).resolve()
    return source == path.resolve() or source.parent == path.resolve()


def _names(entries: list[Path], limit: int = 3) -> str:
    shown = [entry.name + ("/" if entry.is_dir() else "") for entry in entries[:limit]]
    return ", ".join(shown) + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def claim(path: Path, overwrite: bool, resume_from: Optional[str] = None) -> dict[str, tuple[int, int]]:
    """Check that the command may write into `path` (locked by the caller); return the earlier run's files (name ->
    stamp) that `remove_stale` removes once the new command is done. Nothing is removed here."""
    remove_stale_temp_files(path)
    entries = sorted(entry for entry in path.iterdir() if entry.name != LOCK_FILE)
    ours = [entry for entry in entries if is_owned(entry.name)]
    if not entries:
        return {}
    if _continues(path, resume_from):  # the old run's artifacts go; its checkpoint is what this run resumes from
        return {entry.name: _stamp(entry) for entry in ours if entry.name != CHECKPOINT_FILE}
    marker = next((name for name in OUTPUT_MARKERS if (path / name).exists()), None)
    theirs = [entry for entry in entries if not is_owned(entry.name)]
    if marker is None and theirs:  # never write among files perflab did not write, --overwrite or not
        raise PerflabError(f"--out {path} already holds {len(entries)} file(s) that perflab did not write "
                           f"({_names(theirs)}); choose a new or empty directory")
    if not overwrite:
        what = (f"a perflab output ({marker})" if marker else
                f"perflab's files of a command that did not finish ({_names(ours)})")  # e.g. killed mid-profile
        raise PerflabError(f"--out {path} already holds {what}; choose another --out, or add --overwrite to replace "
                           "perflab's files there (yours stay)")
    return {entry.name: _stamp(entry) for entry in ours}


def remove_stale(path: Path, stale: dict[str, tuple[int, int]]) -> None:
    """Remove the earlier run's files that the new command did not rewrite (same inode and mtime as when claimed)."""
    for name, stamp in stale.items():
        entry = path / name
        try:
            if _stamp(entry) != stamp:
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except FileNotFoundError:
            continue


def _create_and_lock(path: Path, stack: ExitStack) -> bool:
    """Check `path`, create it if needed and take its lock (held until `stack` closes); True if it was created here.
    A refused lock raises PerflabError and never removes anything: the folder is the holder's."""
    created = False
    try:
        check_out_path(path)  # a name too long for the file system fails here, in the first stat
        if path.exists() and not path.is_dir():
            raise PerflabError(f"--out {path} exists and is not a directory; choose another --out")
        try:
            path.mkdir(parents=True)  # atomic: of two commands started together, one creates the folder
            created = True
        except FileExistsError:
            pass
        stack.enter_context(out_lock(path))
    except OSError as err:
        if created and path.exists():
            shutil.rmtree(path, ignore_errors=True)
        raise PerflabError(f"cannot write to --out {path}: {err.strerror}; choose a writable directory") from None
    return created


@contextmanager
def run_dir(out: Optional[str], name: str, overwrite: bool = False,
            resume_from: Optional[str] = None) -> Iterator[Path]:
    """Create (or claim) and lock the output directory before any work. On success, an overwritten run's stale files
    go; on failure, remove the directory if this command created it and it holds nothing worth keeping (a
    checkpoint or a result saved as interrupted); an existing folder keeps the earlier run."""
    path = out_path(out, name)
    with ExitStack() as stack:
        created = _create_and_lock(path, stack)
        stale = claim(path, overwrite, resume_from)  # even if created here: another command may have written since
        try:
            yield path
        except BaseException as err:
            interrupted = isinstance(err, KeyboardInterrupt)
            out_of_memory = _recorded_status(path) == "oom"  # an out-of-memory is a result (docs/memory.md)
            keep = out_of_memory or interrupted and any((path / name).exists() for name in KEEP_ON_INTERRUPT)
            if created and not keep:
                shutil.rmtree(path, ignore_errors=True)
            elif (interrupted or out_of_memory) and RESULT_FILE in stale and (path / RESULT_FILE).exists() \
                    and _stamp(path / RESULT_FILE) != stale[RESULT_FILE]:
                remove_stale(path, stale)  # the new run saved its (interrupted) result: the old one's files go
            raise
        remove_stale(path, stale)


@contextmanager
def locked_out(path: Path) -> Iterator[Path]:
    """An output folder that a command fills over time (sweep, tune): checked, created and locked for the whole
    command."""
    path = Path(path).absolute()  # see out_path
    with ExitStack() as stack:
        _create_and_lock(path, stack)
        yield path

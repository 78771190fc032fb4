"""Run directories: `runs/<timestamp>-<name>/`, checked writable up front; never two runs' artifacts in one.

- A directory that already holds a run is refused unless the caller overwrites it (emptied first), or it
  holds an interrupted run whose checkpoint the new run resumes from (then that run is continued there).
- If a run fails, a directory it created is removed, unless it holds work worth keeping: a Ctrl-C leaves
  every checkpoint and finished trial where it is.
- Temp files that a killed atomic write left behind (`.<name>.*.tmp`) are removed on the next use.
"""
from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from perflab.errors import PerflabError
from perflab.workloads.plugin import is_plugin_spec, plugin_name

RUNS_ROOT = Path("runs")
RESULT_FILE = "result.json"
KEEP_ON_INTERRUPT = ("checkpoint.pt", RESULT_FILE)
# Files that mark a directory as perflab's output: only such a directory may be emptied by --overwrite.
OUTPUT_MARKERS = (RESULT_FILE, "compare.json", "sweep.json", "tune.json", "checkpoint.pt")
TEMP_PATTERN = ".*.tmp"


def default_run_dir(name: str) -> Path:
    """runs/<timestamp>-<name>; a plugin spec (`path/to/file.py:build`) is named after its file or module."""
    name = plugin_name(name) if is_plugin_spec(name) else name
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return RUNS_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"


def remove_stale_temp_files(path: Path) -> None:
    """Temp files of atomic writes that a kill interrupted (they are never read)."""
    for temp in path.glob(TEMP_PATTERN):
        temp.unlink(missing_ok=True)


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


def _claim(path: Path, overwrite: bool, resume_from: Optional[str]) -> None:
    """Refuse a directory holding another run; empty it when overwriting; keep a checkpoint being resumed."""
    remove_stale_temp_files(path)
    entries = [entry for entry in path.iterdir() if entry.name != ".perflab-write-test"]
    if not entries:
        return
    if _continues(path, resume_from):
        for entry in entries:  # the old run's artifacts go; its checkpoint is what this run resumes from
            if entry.name != "checkpoint.pt":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        return
    marker = next((name for name in OUTPUT_MARKERS if (path / name).exists()), None)
    if marker is None:  # never empty a folder perflab did not write, --overwrite or not
        raise PerflabError(f"--out {path} already holds {len(entries)} file(s) that perflab did not write; choose "
                           "a new or empty directory")
    if not overwrite:
        raise PerflabError(f"--out {path} already holds a perflab output ({marker}); choose another --out, or add "
                           "--overwrite to empty it first")
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


@contextmanager
def run_dir(out: Optional[str], name: str, overwrite: bool = False,
            resume_from: Optional[str] = None) -> Iterator[Path]:
    """Create (or claim) the output directory before any work; on failure, remove it if this run created it
    and it holds nothing worth keeping (a checkpoint or a result saved as interrupted)."""
    path = Path(out) if out else default_run_dir(name)
    created = not path.exists()
    if path.exists() and not path.is_dir():
        raise PerflabError(f"--out {path} exists and is not a directory; choose another --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".perflab-write-test"
        probe.write_text("")
        probe.unlink()
        if not created:
            _claim(path, overwrite, resume_from)
    except OSError as err:
        if created and path.exists():
            shutil.rmtree(path, ignore_errors=True)
        raise PerflabError(f"cannot write to --out {path}: {err.strerror}; choose a writable directory") from None
    try:
        yield path
    except BaseException as err:
        keep = isinstance(err, KeyboardInterrupt) and any((path / name).exists() for name in KEEP_ON_INTERRUPT)
        keep = keep or _recorded_status(path) == "oom"  # an out-of-memory is a result (docs/memory.md)
        if created and not keep:
            shutil.rmtree(path, ignore_errors=True)
        raise

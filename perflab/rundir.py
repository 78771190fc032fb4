"""Run directories: `runs/<timestamp>-<name>/`, checked writable up front, removed if the run fails."""
from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from perflab.errors import PerflabError
from perflab.workloads.plugin import is_plugin_spec, plugin_name

RUNS_ROOT = Path("runs")


def default_run_dir(name: str) -> Path:
    """runs/<timestamp>-<name>; a plugin spec (`path/to/file.py:build`) is named after its file or module."""
    name = plugin_name(name) if is_plugin_spec(name) else name
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return RUNS_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"


@contextmanager
def run_dir(out: Optional[str], name: str) -> Iterator[Path]:
    """Create the output directory before any work; on failure, remove it if this run created it."""
    path = Path(out) if out else default_run_dir(name)
    created = not path.exists()
    if path.exists() and not path.is_dir():
        raise PerflabError(f"--out {path} exists and is not a directory; choose another --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".perflab-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        if created and path.exists():
            shutil.rmtree(path, ignore_errors=True)
        raise PerflabError(f"cannot write to --out {path}: {err.strerror}; choose a writable directory") from None
    try:
        yield path
    except BaseException:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise

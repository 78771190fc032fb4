"""Which kind of run a folder or a result is: what report/, diagnose/ and the tables title it by."""
from __future__ import annotations

import json
from pathlib import Path

from perflab.errors import PerflabError
from perflab.results.result import RESULT_FILE, Result


def is_serve_result(path: Path) -> bool:
    """True for a run directory whose result.json was written by `perflab serve`."""
    result = path / RESULT_FILE
    if not result.is_file():
        return False
    try:
        return "serve" in (json.loads(result.read_text()).get("metrics") or {})
    except (json.JSONDecodeError, AttributeError):
        return False


def detect_kind(directory: Path) -> str:
    """tune, compare, sweep, memory, serve or run, from the files the directory holds."""
    if (directory / "tune.json").is_file():
        return "tune"
    if (directory / "compare.json").is_file():
        return "compare"
    if (directory / "sweep.jsonl").is_file():
        return "sweep"
    if (directory / "memory.json").is_file():
        return "memory"
    if (directory / RESULT_FILE).is_file():
        return "serve" if is_serve_result(directory) else "run"
    raise PerflabError(f"{directory} holds no result.json, sweep.jsonl, compare.json or tune.json: give a run, "
                       "sweep, compare or tune directory")


def run_kind(result: Result) -> str:
    """"profile" for a run recorded by `perflab profile` (its metrics say how it was profiled), else "run"."""
    return "profile" if result.metrics.profile else "run"

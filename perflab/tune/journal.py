"""tune.jsonl: one line per finished trial, appended and fsynced at once, keyed by the trial's resolved config.

A kill at any moment loses at most the trial that was running; `--resume` reads the lines back and the
driver reuses them instead of running those trials again (the same file format as sweep.jsonl).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.sweep.points import check_same_search, point_key, read_rows, trim_partial_line
from perflab.tune.rows import TrialRow

TUNE_JSONL = "tune.jsonl"


def trial_key(cfg: RunConfig, kind: str, serve: Any = None) -> str:
    """A trial's identity: what it runs (run, profile or serve) and its resolved config, output directory aside;
    a serve trial's settings too (a --resume with another --p99-ms measures again)."""
    key = f"{kind}-{point_key(cfg)}"
    if serve is None:
        return key
    settings = json.dumps(serve.to_dict(), sort_keys=True, default=str).encode()
    return f"{key}-{hashlib.sha1(settings).hexdigest()[:8]}"


class Journal:
    """The rows of tune.jsonl by key; `append` writes one row durably before anything else happens."""

    def __init__(self, out: Path, resume: bool):
        self.path = Path(out) / TUNE_JSONL
        if self.path.exists() and not resume:
            raise PerflabError(f"--out {out} already holds a tune; add --resume to continue it, or choose "
                               "another --out")
        trim_partial_line(self.path)
        read = [TrialRow.from_dict(row) for row in read_rows(self.path)] if self.path.exists() else []
        self.rows: dict[str, TrialRow] = {row.key: row for row in read}

    def check_same_start(self, start: RunConfig, kind: str) -> None:
        """On --resume, the journal's first trial must be this tune's start (same options, same kind of measured
        trial): another tune's trials would be overwritten and its trial numbers repeated."""
        first = min(self.rows.values(), key=lambda row: row.index, default=None)
        if first is None:
            return
        recorded = {"measured trial": first.kind or None, **first.config}
        current = {"measured trial": kind, **start.to_dict()}
        check_same_search(self.path.parent, recorded, current, "a tune")

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key: str) -> Optional[TrialRow]:
        return self.rows.get(key)

    def append(self, row: TrialRow) -> None:
        # known in memory first: a Ctrl-C while the line is being written and synced (a reader can already see it)
        # must still find the trial, or tune.json is not written for a start that finished (seen in CI)
        self.rows[row.key] = row
        with open(self.path, "a") as stream:
            stream.write(json.dumps(row.to_dict(), allow_nan=True, default=str) + "\n")
            stream.flush()
            os.fsync(stream.fileno())

    def ordered(self) -> list[TrialRow]:
        return sorted(self.rows.values(), key=lambda row: row.index)

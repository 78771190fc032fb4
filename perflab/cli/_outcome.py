"""How a finished single run ends on the terminal: its table, then what its status means, as an exit code."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.markup import escape

from perflab.errors import EXIT_OUT_OF_MEMORY
from perflab.oom import OutOfMemory
from perflab.report.terminal import print_result
from perflab.results import Result

EXIT_INTERRUPTED = 130


def finish_run(console: Console, err_console: Console, result: Result, out: Path) -> int:
    """Print the result (and why it is not a clean measurement, if it is not); return the exit code."""
    if result.trials:
        print_result(console, result)
    if result.status == "interrupted":
        checkpoint = out / "checkpoint.pt"
        resume = (f"; resume training with --resume-from {checkpoint}" if checkpoint.exists() else "")
        err_console.print(f"[yellow]interrupted[/]: {escape(result.status_reason)}; saved in {escape(str(out))} "
                          f"(result.json marked interrupted){escape(resume)}", highlight=False)
        return EXIT_INTERRUPTED
    if result.status == "invalid":
        err_console.print(f"[bold red]invalid run[/]: {escape(result.status_reason)}; saved in {escape(str(out))} "
                          "(result.json marked invalid)", highlight=False)
        return 1
    if result.quality and result.quality.failed:
        console.print(f"[bold red]quality gate failed[/]: {escape(result.quality.reason)}; the result is "
                      "saved (tolerances: docs/quality.md)", highlight=False)
        return 1
    if result.quality and result.quality.inconclusive:  # no pass, no fail: the run itself is fine
        console.print(f"[yellow]quality gate inconclusive[/]: {escape(result.quality.reason)}; the numerics of "
                      "these levers are not verified (docs/quality.md)", highlight=False)
    return 0


def points_out_of_memory(err_console: Console, rows: list[dict]) -> Optional[int]:
    """For a sweep or scale: the block of the first point that did not fit and exit code 3, or None if all fit."""
    out_of_memory = [row for row in rows if row["status"] == "oom"]
    if not out_of_memory:
        return None
    first = out_of_memory[0]
    record = first.get("out_of_memory") or {"message": first.get("error") or "out of memory", "device": "?"}
    err_console.print(f"point {escape(first['label'])}: " + escape(OutOfMemory.from_dict(record).block()),
                      highlight=False, soft_wrap=True)
    err_console.print(f"{len(out_of_memory)} of {len(rows)} point(s) did not fit; the others are kept",
                      highlight=False)
    return EXIT_OUT_OF_MEMORY

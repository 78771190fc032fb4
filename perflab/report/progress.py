"""A rich progress bar behind the harness's Reporter hooks."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from perflab.harness.progress import Reporter


class RichReporter(Reporter):
    """Draws one bar per stage (warm-up, trials); advancing is a counter update, cheap inside the loop."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task: Optional[TaskID] = None

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start(self, description: str, total: int) -> None:
        self.task = self.progress.add_task(description, total=total)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def finish(self) -> None:
        self.task = None

    def note(self, message: str) -> None:
        self.progress.console.print(f"[dim]{message}[/]")

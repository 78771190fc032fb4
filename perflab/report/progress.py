"""A rich progress bar behind the harness's Reporter hooks."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

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

    @contextmanager
    def stage(self, description: str) -> Iterator[None]:
        """On a terminal, a bar that pulses with the time spent until the stage ends; piped, one line as it starts
        and one as it ends (a log gets no redrawn bar)."""
        if not self.console.is_terminal:
            began = time.perf_counter()
            self.console.print(description, highlight=False)
            yield
            self.console.print(f"{description.split(':')[0]}: done in {time.perf_counter() - began:.1f} s",
                               highlight=False)
            return
        task = self.progress.add_task(description, total=None)
        try:
            yield
        finally:
            self.progress.update(task, total=1, completed=1)

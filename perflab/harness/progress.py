"""Progress reporting hooks: the library calls them, the CLI draws them (rich), tests ignore them."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class Reporter:
    """Silent by default; the CLI passes one that draws a progress bar."""

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    @contextmanager
    def stage(self, description: str) -> Iterator[None]:
        """A stage with no steps to count (the quality gate): shown while it runs."""
        yield

"""StepHook: optional work that wears the timed trials (profiler capture, checkpoints) without living in the loop."""
from __future__ import annotations


class StepHook:
    """Override what you need. `start` runs once after the plan is built, before warm-up; the hook is
    entered as a context manager around the timed trials; `after_step` runs at the end of every timed step
    (inside the step's time, so work it does shows up: time it as a phase with `timer.phase(name)`)."""

    def start(self, plan) -> None:
        pass

    def __enter__(self) -> "StepHook":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def after_step(self, plan, timer, step: int) -> None:
        pass

    def finish(self, result) -> None:
        """Called with the Result before run() returns (e.g. to add files or notes)."""

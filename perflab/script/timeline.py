"""The script's steps on a clock: step boundaries and phases, timed with the harness's own timers.

On CUDA the timer records CUDA events in stream order (no host sync while the script runs) and the data wait
by the host clock, as in `perflab run`; on the CPU everything is by the host clock. A step runs from one
boundary to the next, so the time after the last boundary (the script's teardown) is never a step.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch

from perflab.step.timers import make_timer

MAX_RECORDED_STEPS = 5_000  # bounds the events a very long script accumulates; later steps are counted only


class StepTimeline:
    """Steps and their phases as the script runs; `steps()` afterwards (after `close()`)."""

    def __init__(self):
        self.timer = None
        self.device: Optional[str] = None  # "cuda" when the script had initialised CUDA at its first step
        self.boundaries = 0  # of the current step source
        self.unreadable: Optional[str] = None  # why the CUDA events cannot be read, if they cannot

    @property
    def started(self) -> bool:
        return self.timer is not None

    def _begin(self) -> None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.device = "cuda" if cuda else "cpu"
        self.timer = make_timer(torch.device(self.device), sync_phases=False)
        self.timer.step_start()

    def _recording(self) -> bool:
        return self.boundaries < MAX_RECORDED_STEPS

    def phase(self, name: str):
        """Time `name` on the timer's clock (CUDA events on a GPU); begins step 1 if nothing has yet."""
        if self.timer is None:
            self._begin()
        return self.timer.phase(name) if self._recording() else nullcontext()

    def host_phase(self, name: str):
        """Time `name` by the host clock (the host blocked, e.g. on the data loader)."""
        if self.timer is None:
            self._begin()
        return self.timer.host_phase(name) if self._recording() else nullcontext()

    def boundary(self, restart: bool) -> None:
        """One step ended and the next began; with `restart`, forget the steps counted so far."""
        if self.timer is None:  # nothing was timed before this boundary: it begins step 1
            self._begin()
            return
        if restart and self.boundaries:
            self.boundaries = 0
            self._begin()
            return
        ends_recorded_step = self._recording()
        self.boundaries += 1
        if ends_recorded_step:
            self.timer.finish()  # the end of the last recorded step, moved forward at every boundary
            if self._recording():
                self.timer.step_start()

    def close(self) -> None:
        """Wait for the device so CUDA events can be read; a script that broke the CUDA context leaves no timings."""
        if self.device == "cuda":
            try:
                torch.cuda.synchronize()
            except RuntimeError as err:  # e.g. a device-side assert in the script: its traceback says why
                self.unreadable = str(err).splitlines()[0]

    def steps(self) -> tuple[list[float], list[dict[str, float]]]:
        """(step_ms, phase_ms) of every completed, recorded step, in order."""
        if self.timer is None or self.boundaries == 0 or self.unreadable:
            return [], []
        recorded = min(self.boundaries, MAX_RECORDED_STEPS)
        return self.timer.step_ms()[:recorded], self.timer.phase_ms()[:recorded]


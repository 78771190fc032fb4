"""The script's steps on a clock: step boundaries and phases, timed with the harness's own timers.

On CUDA the timer records CUDA events in stream order (no host sync while the script runs) and the data wait
by the host clock, as in `perflab run`; on the CPU everything is by the host clock. A step runs from one
boundary to the next, so the time after the last boundary (the script's teardown) is never a step.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Optional

import torch

from perflab.harness.timers import make_timer

MAX_RECORDED_STEPS = 5_000  # bounds the events a very long script accumulates; later steps are counted only


class StepTimeline:
    """Steps and their phases as the script runs; `steps()` afterwards (after `close()`)."""

    def __init__(self):
        self.timer = None
        self.device: Optional[str] = None  # "cuda" when the script had initialised CUDA at its first step
        self.boundaries = 0  # of the current step source
        self.restarts = 0
        self.began_s: Optional[float] = None  # host clock at the start of step 1
        self.boundary_times_s: list[float] = []  # host clock at each boundary

    @property
    def started(self) -> bool:
        return self.timer is not None

    def _begin(self) -> None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.device = "cuda" if cuda else "cpu"
        self.timer = make_timer(torch.device(self.device), sync_phases=False)
        self.began_s = time.perf_counter()
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
            self.restarts += 1
            self.boundaries = 0
            self.boundary_times_s = []
            self._begin()
            return
        self.boundaries += 1
        self.boundary_times_s.append(time.perf_counter())
        if self._recording():
            self.timer.finish()  # the end of the last recorded step, moved forward at every boundary
            self.timer.step_start()

    def close(self) -> None:
        """Wait for the device so CUDA events can be read."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def steps(self) -> tuple[list[float], list[dict[str, float]]]:
        """(step_ms, phase_ms) of every completed, recorded step, in order."""
        if self.timer is None or self.boundaries == 0:
            return [], []
        recorded = min(self.boundaries, MAX_RECORDED_STEPS)
        return self.timer.step_ms()[:recorded], self.timer.phase_ms()[:recorded]


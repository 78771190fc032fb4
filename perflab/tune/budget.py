"""The tune's time budget: what is spent, what is left for a trial, and what is held back for a confirmation.

The budget is a promise (tune ends within 5% of it), so it is charged real time: every recorded trial's wall time
(reused ones on --resume included) plus what the tuning process spends outside its trials (diagnoses, workload
builds, bookkeeping). A little is kept for writing tune.json and the report once the last trial is stopped.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

# Seconds kept for writing tune.json and the report after the last trial; at most FINISH_RESERVE_SHARE of the budget.
FINISH_RESERVE_S = 4.0
FINISH_RESERVE_SHARE = 0.02
MIN_TRIAL_LEFT_S = 1.0  # less left than this: no trial can start and finish in it


@dataclass
class Budget:
    """Seconds of a tune: `total_s` promised, charged per recorded trial and for the time spent between trials."""

    total_s: float
    clock: Callable[[], float] = time.perf_counter
    began: Optional[float] = None  # when this process started tuning (None: not yet)
    recorded_s: float = 0.0  # the wall time of every trial row used, fresh or reused
    fresh_trial_s: float = 0.0  # of that, the trials this process ran (timed here, around the runner)
    held_s: float = 0.0  # held back for confirming the best screened win so far: screens may not use it
    charged: set[str] = field(default_factory=set)  # the keys of the rows charged

    def start(self) -> None:
        """Start charging this process's own time (outside its trials)."""
        self.began = self.clock()

    @property
    def spent_s(self) -> float:
        """Recorded trials plus this process's own time outside them."""
        if self.began is None:
            return self.recorded_s
        outside = max(0.0, self.clock() - self.began - self.fresh_trial_s)
        return self.recorded_s + outside

    @property
    def finish_reserve_s(self) -> float:
        return min(FINISH_RESERVE_S, FINISH_RESERVE_SHARE * self.total_s)

    def left_s(self) -> float:
        """What a trial may take from now: the budget left, less the reserve for writing the results."""
        return self.total_s - self.spent_s - self.finish_reserve_s

    def free_s(self) -> float:
        """What a screen may take from now: the time left less what is held for a confirmation (never below 0)."""
        return max(0.0, self.left_s() - self.held_s)

    def share_s(self, share: float) -> float:
        """`share` of the whole budget, in seconds."""
        return share * self.total_s

    def hold(self, seconds: float) -> None:
        """Hold `seconds` back for a confirmation (0: hold nothing)."""
        self.held_s = max(0.0, seconds)

    def is_spent(self) -> bool:
        """No trial can start and finish in what is left."""
        return self.spent_s >= self.total_s or self.left_s() < MIN_TRIAL_LEFT_S

    def spent_line(self) -> str:
        """'37 s of 90 s', for the stop line."""
        return f"{self.spent_s:.0f} s of {self.total_s:.0f} s"

    def charge(self, key: str, wall_s: float) -> None:
        """Charge a recorded trial once (a row reused within this session, a screen as a reference, costs nothing)."""
        if key not in self.charged:
            self.recorded_s += wall_s
            self.charged.add(key)

    @contextmanager
    def running_trial(self) -> Iterator[None]:
        """Wear around a trial this process runs: its time is charged through its row, not twice."""
        began = self.clock()
        try:
            yield
        finally:
            self.fresh_trial_s += self.clock() - began

"""One more try for a lever measured inside the noise while its finding predicted a large gain.

A one-value lever whose trial shows no significant change, although the finding that proposed it predicted at
least RETRY_PREDICTED_PCT, is not counted as lost yet: it is deferred, and tried once more after the next kept
lever (the bottleneck has moved, and the prediction may hold there). Inside the noise a second time, it is lost.
Searches (worker counts, compile modes) are not retried: their prediction is the finding's, not the value's.
"""
from __future__ import annotations

from typing import Optional

from perflab.tune.rows import TrialRow

RETRY_PREDICTED_PCT = 25.0
NO_SIGNIFICANT_CHANGE = "no significant change"


class NoiseRetries:
    """Which levers wait for their one retry, and which have had it."""

    def __init__(self) -> None:
        self.deferred: list[str] = []
        self.retried: set[str] = set()

    def defer(self, lever: str, once: bool, row: TrialRow) -> Optional[str]:
        """Defer a lever whose trial (`row`) was inside the noise against a large prediction; the note to record,
        or None when the lever is lost instead."""
        predicted = row.predicted_gain_pct
        verdict = row.decision.verdict if row.decision is not None else None
        if (not once or lever in self.retried or predicted is None or predicted < RETRY_PREDICTED_PCT
                or verdict != NO_SIGNIFICANT_CHANGE):
            return None
        self.deferred.append(lever)
        return (f"{lever} measured inside the noise ({row.measured_gain_pct or 0:+.1f}%) although the "
                f"diagnosis predicted {predicted:+.0f}%: tried once more after the next kept lever")

    def release(self) -> list[str]:
        """After a kept lever: the deferred levers, each now given its one retry."""
        released, self.deferred = self.deferred, []
        self.retried.update(released)
        return released

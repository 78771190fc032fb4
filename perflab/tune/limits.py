"""When the search must stop before another trial: the budget is spent, or --max-trials is reached."""
from __future__ import annotations

from typing import Callable, NoReturn, Optional

from perflab.tune.budget import Budget
from perflab.tune.stop import StopKind, StopReason


class SearchStopped(Exception):
    """Raised inside the loop when the budget or --max-trials says stop; carries the reason."""

    def __init__(self, reason: StopReason):
        super().__init__(reason.text())
        self.reason = reason


class TrialLimits:
    """The budget and --max-trials over the trials recorded so far (`count`, reused ones included)."""

    def __init__(self, budget: Budget, max_trials: Optional[int], count: Callable[[], int]):
        self.budget, self.max_trials, self.count = budget, max_trials, count

    def reason(self) -> Optional[StopReason]:
        """Why no further trial may start (the budget, or --max-trials, is spent), or None."""
        if self.budget.is_spent():
            return StopReason(StopKind.BUDGET_SPENT, self.budget.spent_line())
        if self.max_trials is not None and self.count() >= self.max_trials:
            return StopReason(StopKind.MAX_TRIALS, str(self.max_trials))
        return None

    def check(self) -> None:
        """Stop the search when no further trial may start."""
        reason = self.reason()
        if reason is not None:
            raise SearchStopped(reason)

    def stop(self, reason: StopReason) -> NoReturn:
        """End the search now (the budget or --max-trials says so): the loop returns `reason`."""
        raise SearchStopped(reason)

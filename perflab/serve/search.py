"""The max-QPS search, as LoadGen's peak finder does it: widen (double the rate until a point fails, or halve it
until one passes) to bracket the peak, then bisect the bracket until it is narrower than the tolerance."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

MAX_POINTS = 16
LOWEST_FRACTION = 1 / 64  # give up halving below this fraction of the starting rate


@dataclass
class SearchOutcome:
    """The highest passing rate (None: even the lowest tried failed), the bracket, and every rate tried."""

    max_qps: Optional[float]
    lowest_failing_qps: Optional[float]
    tried: list[tuple[float, bool]] = field(default_factory=list)


def find_max_qps(passes: Callable[[float], bool], start_qps: float, tolerance: float = 0.05,
                 max_points: int = MAX_POINTS, lowest_qps: float = 0.0) -> SearchOutcome:
    """Search the highest rate for which `passes(rate)` holds, to within `tolerance` (relative); halving stops
    at `lowest_qps` (or 1/64 of the start)."""
    tried: list[tuple[float, bool]] = []

    def attempt(rate: float) -> bool:
        passed = passes(rate)
        tried.append((rate, passed))
        return passed

    low: Optional[float] = None
    high: Optional[float] = None
    rate = start_qps
    if attempt(rate):
        low = rate
        while high is None and len(tried) < max_points:
            rate *= 2
            if attempt(rate):
                low = rate
            else:
                high = rate
    else:
        high = rate
        floor = max(lowest_qps, start_qps * LOWEST_FRACTION)
        while low is None and len(tried) < max_points and rate / 2 >= floor:
            rate /= 2
            if attempt(rate):
                low = rate
            else:
                high = rate
    while low is not None and high is not None and high - low > tolerance * low and len(tried) < max_points:
        middle = (low + high) / 2
        if attempt(middle):
            low = middle
        else:
            high = middle
    return SearchOutcome(low, high, tried)

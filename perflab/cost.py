"""What a million samples (or queries) cost, for a machine priced per hour (--gpu-cost-per-hour)."""
from __future__ import annotations

from typing import Optional


def cost_per_million(cost_per_hour: Optional[float], per_second: Optional[float]) -> Optional[float]:
    """The price of a million items processed at `per_second`; None without a price or a rate."""
    if cost_per_hour is None or per_second is None or not per_second > 0:
        return None
    return cost_per_hour / 3600.0 / per_second * 1e6

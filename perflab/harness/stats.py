"""Statistics for trials: medians, spreads, percentiles and bootstrap confidence intervals."""
from __future__ import annotations

from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000


def percentiles(values: Sequence[float], points: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """{'p50': ..., 'p95': ..., 'p99': ...} with linear interpolation."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {f"p{int(p)}": float("nan") for p in points}
    return {f"p{int(p)}": float(np.percentile(array, p)) for p in points}


def bootstrap_ci(values: Sequence[float], statistic=np.median, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of `statistic`; a single value gives (v, v)."""
    array = np.asarray(values, dtype=float)
    if array.size < 2:
        value = float(array[0]) if array.size else float("nan")
        return value, value
    rng = np.random.default_rng(seed)
    samples = rng.choice(array, size=(BOOTSTRAP_RESAMPLES, array.size), replace=True)
    stats = statistic(samples, axis=1)
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(stats, tail)), float(np.percentile(stats, 100 - tail))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, mean, min, max, stdev, relative spread (range over median, in %) and a 95% CI of the median."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("summarize() needs at least one value")
    median = float(np.median(array))
    low, high = bootstrap_ci(array)
    return {
        "median": median,
        "mean": float(array.mean()),
        "min": float(array.min()),
        "max": float(array.max()),
        "stdev": float(array.std(ddof=1)) if array.size > 1 else 0.0,
        "range_pct": float((array.max() - array.min()) / median * 100) if median else 0.0,
        "ci95_low": low,
        "ci95_high": high,
        "n": int(array.size),
    }

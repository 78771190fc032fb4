"""Statistics for trials: medians, spreads, percentiles and bootstrap confidence intervals."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
# Comparing two runs resamples each side, and a ratio's tails are wider: more resamples steady its interval.
RATIO_BOOTSTRAP_RESAMPLES = 4000
NO_INTERVAL = "1 trial, no interval"  # what every report shows for fewer than 2 trials: a zero-width CI says nothing


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
    return _percentile_interval(_resampled(array, statistic, rng, BOOTSTRAP_RESAMPLES), confidence)


def bootstrap_ratio_ci(base: Sequence[float], candidate: Sequence[float], statistic: Callable = np.median,
                       confidence: float = 0.95, seed: int = 0,
                       resamples: int = RATIO_BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap interval of statistic(candidate) / statistic(base), each side resampled on its own."""
    base, candidate = np.asarray(base, dtype=float), np.asarray(candidate, dtype=float)
    rng = np.random.default_rng(seed)
    base_stats = _resampled(base, statistic, rng, resamples)  # drawn first: the order fixes the seeded stream
    cand_stats = _resampled(candidate, statistic, rng, resamples)
    return _percentile_interval(cand_stats / base_stats, confidence)


def _resampled(array: np.ndarray, statistic: Callable, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """`statistic` of `resamples` resamples (with replacement) of `array`, one value per resample."""
    return statistic(rng.choice(array, size=(resamples, array.size), replace=True), axis=1)


def _percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, mean, min, max, stdev, relative spread (range over median, in %) and a 95% CI of the median (None
    from a single value: one trial has no interval)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("summarize() needs at least one value")
    median = float(np.median(array))
    low, high = bootstrap_ci(array) if array.size > 1 else (None, None)
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


def interval_text(low: Optional[float], high: Optional[float], trials: Optional[int],
                  number: Callable[[Optional[float]], str]) -> str:
    """'95% CI 5.1–5.9' for the reports, or NO_INTERVAL when fewer than 2 trials measured it."""
    if low is None or high is None or (trials is not None and trials < 2):
        return NO_INTERVAL
    return f"95% CI {number(low)}–{number(high)}"

"""When queries arrive: seeded Poisson arrivals (server), all at once (offline), or one after another
(single-stream: issued as each query completes)."""
from __future__ import annotations

import math

import numpy as np


def poisson_arrivals(rate_qps: float, duration_s: float, min_queries: int, seed: int) -> np.ndarray:
    """Arrival times in seconds from 0: exponential gaps of mean 1/rate, until both `duration_s` has passed
    and `min_queries` have arrived (LoadGen's two minimums)."""
    rng = np.random.default_rng(seed)
    count = max(min_queries, math.ceil(rate_qps * duration_s * 1.2) + 16)
    gaps = rng.exponential(1.0 / rate_qps, size=count)
    times = np.cumsum(gaps) - gaps[0]  # the first query arrives at 0
    while times[-1] < duration_s:  # rare: the draw ran short of the duration
        more = np.cumsum(rng.exponential(1.0 / rate_qps, size=count)) + times[-1]
        times = np.concatenate([times, more])
    within = int(np.searchsorted(times, duration_s, side="left"))
    return times[:max(within, min_queries)]


def offline_arrivals(rate_hint_qps: float, duration_s: float, min_queries: int) -> np.ndarray:
    """Every query available at 0: enough of them to keep the model busy for about `duration_s` at the
    expected throughput `rate_hint_qps`, and at least `min_queries`."""
    return np.zeros(max(min_queries, math.ceil(rate_hint_qps * duration_s)))


def sample_order(queries: int, samples: int, seed: int) -> np.ndarray:
    """Which of the loaded samples each query carries: a seeded shuffle, repeated as needed."""
    rng = np.random.default_rng(seed)
    rounds = math.ceil(queries / samples)
    return np.concatenate([rng.permutation(samples) for _ in range(rounds)])[:queries]

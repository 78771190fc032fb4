"""When queries arrive: seeded Poisson arrivals (server), all at once (offline), or one after another
(single-stream: issued as each query completes)."""
from __future__ import annotations

import math

import numpy as np


UNIT_CHUNK = 4096  # unit-rate gaps are drawn in chunks of this many, so every rate reads the same stream


def unit_arrivals(count: int, seed: int) -> np.ndarray:
    """The first `count` arrivals of one seed's Poisson process at 1 query/s (the first at 0). The gaps are drawn in
    fixed chunks from one generator, so a longer schedule extends a shorter one: the same seed, scaled, gives every
    rate the same pattern of gaps (LoadGen scales one seed's schedule to each rate)."""
    rng = np.random.default_rng(seed)
    chunks = math.ceil(count / UNIT_CHUNK)
    gaps = np.concatenate([rng.exponential(1.0, size=UNIT_CHUNK) for _ in range(chunks)])[:count]
    return np.cumsum(gaps) - gaps[0]


def poisson_arrivals(rate_qps: float, duration_s: float, min_queries: int, seed: int) -> np.ndarray:
    """Arrival times in seconds from 0: one seed's unit-rate arrivals divided by the rate, until both `duration_s`
    has been reached (the last query is scheduled at or past it) and `min_queries` have arrived (LoadGen's two
    minimums). Two rates of one seed differ only by the scale: arrivals(r1) * r1 == arrivals(r2) * r2."""
    count = max(min_queries, math.ceil(rate_qps * duration_s * 1.2) + 16)
    while True:
        times = unit_arrivals(count, seed) / rate_qps
        if times[-1] >= duration_s:
            break
        count *= 2  # rare: the draw ran short of the duration
    reached = int(np.searchsorted(times, duration_s, side="left")) + 1  # the first query at or past the duration
    return times[:max(reached, min_queries)]


def sample_order(queries: int, samples: int, seed: int) -> np.ndarray:
    """Which of the loaded samples each query carries: a seeded shuffle, repeated as needed."""
    rng = np.random.default_rng(seed)
    rounds = math.ceil(queries / samples)
    return np.concatenate([rng.permutation(samples) for _ in range(rounds)])[:queries]

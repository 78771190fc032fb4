"""Whether a load point is VALID, as MLPerf LoadGen decides it: its minimum duration and query count met, and (server)
its latency bound met with the confidence LoadGen's early stopping asks for.

Early stopping (LoadGen's `early_stopping.cc`, MLPerf Inference rules): with `over` of `n` queries past the bound,
the run shows its p-th percentile is within the bound, with confidence c, when seeing at most `over` late queries
in `n` would be unlikely (probability < 1 - c) were each query late with probability 1 - p, the most a passing
system may have. That probability is the binomial CDF P[Binomial(n, 1 - p) <= over]; the fewest on-time queries
that make it small enough is `min_passing_queries(over)`: 459 at p = 0.99 with none late (0.99^459 < 0.01).

Percentiles are nearest-rank: the smallest latency that at least p% of the queries are at or under (no
interpolation between two queries' latencies: the verdict is read off one real query)."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import numpy as np

from perflab.results.metrics import EarlyStopping, LoadPoint, PointValidity

CONFIDENCE = 0.99  # LoadGen's early-stopping confidence
TARGET_PERCENTILE = 99.0  # the percentile --p99-ms bounds
MOST_QUERIES_TO_SHOW = 2_000_000  # serve's most queries per point (config.MAX_QUERIES_PER_POINT)


def nearest_rank(values: np.ndarray, percentile: float) -> float:
    """The nearest-rank percentile: the ceil(p/100 * n)-th smallest value (NaN for no values)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    if ordered.size == 0:
        return float("nan")
    rank = max(1, math.ceil(percentile / 100 * ordered.size - 1e-9))  # 1e-9: 0.99 * 100 is 98.99999...
    return float(ordered[rank - 1])


def late_odds(on_time: int, late: int, percentile: float) -> float:
    """P[at most `late` of on_time + late queries are late], each late with probability 1 - percentile/100."""
    queries = on_time + late
    p_late = 1 - percentile / 100
    if late >= queries:
        return 1.0
    ks = np.arange(late + 1)
    # log C(n, k), built up as log C(n, k-1) + log(n - k + 1) - log(k)
    log_choose = np.concatenate([[0.0], np.cumsum(np.log(queries - ks[1:] + 1) - np.log(ks[1:]))])
    log_terms = log_choose + ks * math.log(p_late) + (queries - ks) * math.log1p(-p_late)
    top = log_terms.max()
    return float(math.exp(top) * np.exp(log_terms - top).sum())


@lru_cache(maxsize=4096)
def min_passing_queries(late: int, percentile: float = TARGET_PERCENTILE, confidence: float = CONFIDENCE) -> int:
    """The fewest on-time queries h such that `late` late ones in h + late show the percentile is met (odds < 1 - c)."""
    high = 1
    while late_odds(high, late, percentile) >= 1 - confidence:
        high *= 2
    low = high // 2  # fails (or is 0)
    while high - low > 1:
        middle = (low + high) // 2
        if late_odds(middle, late, percentile) < 1 - confidence:
            high = middle
        else:
            low = middle
    return high


def early_stopping(latency_ms: np.ndarray, bound_ms: float, percentile: float = TARGET_PERCENTILE
                   ) -> EarlyStopping:
    """LoadGen's early-stopping test of a server point: late queries (past the bound), the queries that many late
    ones need, whether the point had them, and the percentile estimate those queries support (the latency the
    true percentile is under with 99% confidence; None with too few queries for any)."""
    latency_ms = np.asarray(latency_ms, dtype=float)
    queries = int(latency_ms.size)
    late = int((latency_ms > bound_ms).sum())
    needed = min_passing_queries(late, percentile) + late
    return EarlyStopping.from_dict({  # another percentile's estimate is kept under its own key (in `extra`)
        "late_queries": late, "queries": queries, "queries_needed": needed, "met": queries >= needed,
        "confidence": CONFIDENCE, f"p{percentile:g}_estimate_ms": percentile_estimate(latency_ms, percentile)})


def percentile_estimate(latency_ms: np.ndarray, percentile: float = TARGET_PERCENTILE) -> Optional[float]:
    """LoadGen's early-stopping percentile estimate: discard the largest t - 1 latencies, for the largest t that
    the query count supports (n >= min_passing_queries(t) + t), and read the next one (None when n is too small)."""
    queries = int(np.asarray(latency_ms).size)
    if queries < min_passing_queries(1, percentile) + 1:
        return None
    # supported(low) holds; h(t) >= t * p / (1 - p), so no t past n * (1 - p) + 1 is supported
    low, high = 1, min(queries, math.ceil(queries * (1 - percentile / 100)) + 2)
    while high - low > 1:
        middle = (low + high) // 2
        if min_passing_queries(middle, percentile) + middle <= queries:
            low = middle
        else:
            high = middle
    return float(np.sort(latency_ms)[queries - low])


def queries_to_show(late: int, queries: int, percentile: float = TARGET_PERCENTILE,
                    most: int = MOST_QUERIES_TO_SHOW) -> Optional[int]:
    """The queries a longer run with the same fraction of late queries needs for early stopping to pass (None: the
    fraction is past 1 - p, or it would take more than `most`)."""
    fraction = late / queries if queries else 0.0
    if fraction >= 1 - percentile / 100:
        return None
    needed = min_passing_queries(late, percentile) + late
    while needed <= most:  # each round expects more late queries in the longer run; it converges below 1 - p
        expected_late = math.ceil(fraction * needed)
        longer = min_passing_queries(expected_late, percentile) + expected_late
        if longer <= needed:
            return needed
        needed = longer
    return None


def point_validity(point: LoadPoint, latency_ms: np.ndarray, last_arrival_s: float, bound_ms: float,
                   duration_s: float, min_queries: int) -> PointValidity:
    """VALID or INVALID with every reason, as LoadGen's summary says it: minimum duration and query count, and for a
    server point the latency bound at the nearest-rank p99 and early stopping; a late harness or NaN/inf outputs
    (set in the point before) also invalidate it. `flags` hold warnings that do not."""
    reasons: list[str] = []
    length_reasons = 0  # reasons a longer run at the same rate could remove: the point was too short, not too slow
    scenario = point.scenario
    lasted_s = last_arrival_s if scenario == "server" else point.duration_s
    if not lasted_s >= duration_s:
        what = "the last query was scheduled at" if scenario == "server" else "the point lasted"
        reasons.append(f"minimum duration not met: {what} {lasted_s:.2f} s, under --duration {duration_s:g} s")
        length_reasons += 1
    if point.completed < min_queries:
        reasons.append(f"minimum query count not met: {point.completed:,} completed, under --min-queries "
                       f"{min_queries:,}")
        length_reasons += 1
    stopping = None
    if scenario in ("server", "single-stream"):
        stopping = early_stopping(latency_ms, bound_ms)
    if scenario == "server":
        p99 = point.p99_ms
        if not p99 <= bound_ms:
            reasons.append(f"latency bound not met: p99 {p99:.2f} ms > {bound_ms:g} ms")
        if not stopping.met:
            reasons.append(f"early stopping not met: {stopping.late_queries:,} of {stopping.queries:,} queries "
                           f"past {bound_ms:g} ms need {stopping.queries_needed:,} queries to show p99 within the "
                           "bound with 99% confidence")
            length_reasons += p99 <= bound_ms  # the bound met on too few queries to show it: too short
        stopping.queries_to_show = queries_to_show(stopping.late_queries, stopping.queries)
    elif scenario == "single-stream" and stopping.p99_estimate_ms is None:
        reasons.append(f"too few queries for an early-stopping p99 estimate: {stopping.queries:,}, it needs "
                       f"{min_passing_queries(1) + 1:,}")
        length_reasons += 1
    if point.overloaded:
        reasons.append(f"overloaded: {point.overloaded.unserved:,} queries left unserved")
    if point.harness_late:
        reasons.append(f"harness late: dispatch delay p99 {point.dispatch_delay_ms.p99_ms:.2f} ms")
    if point.non_finite:
        reasons.append(point.non_finite)
    flags = []
    worst_ms = point.dispatch_delay_ms.max_ms if point.dispatch_delay_ms else None
    if scenario == "server" and worst_ms is not None and worst_ms > bound_ms:
        flags.append(f"worst dispatch delay {worst_ms:.1f} ms is beyond the {bound_ms:g} ms bound: a batch was held "
                     "up by the harness (GIL, sleep overshoot) longer than the whole latency budget")
    too_short = bool(reasons) and length_reasons == len(reasons)
    return PointValidity(valid=not reasons, reasons=reasons, flags=flags, early_stopping=stopping, too_short=too_short)


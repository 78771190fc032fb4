"""A load point is VALID or INVALID as MLPerf LoadGen judges it: minimum duration and query count, the nearest-rank
p99 within the bound, and early stopping's binomial test at 99% confidence; the max-QPS search passes only VALID
points."""
import math

import numpy as np
import pytest

from perflab.config import RunConfig
from perflab.results.metrics import DispatchDelay, LoadPoint, PointValidity
from perflab.serve import ServeConfig, serve
from perflab.serve.capacity import FixedTimeEngine
from perflab.serve.validity import (early_stopping, late_odds, min_passing_queries, nearest_rank,
                                    percentile_estimate)

CPU_MLP = RunConfig(workload="mlp", device="cpu", warmup=1)


def test_early_stopping_needs_459_queries_on_time_when_none_is_late():
    # By hand: with none late, P[no late query in h] = 0.99^h must fall under 1 - 0.99 = 0.01:
    # h > ln(0.01) / ln(0.99) = 458.2, so h = 459.
    assert math.log(0.01) / math.log(0.99) == pytest.approx(458.21, abs=0.01)
    assert min_passing_queries(0) == 459
    assert late_odds(459, 0, 99.0) == pytest.approx(0.99 ** 459) and 0.99 ** 459 < 0.01 <= 0.99 ** 458


def test_early_stopping_with_one_late_query_matches_the_binomial_by_hand():
    # One late in n = h + 1: P[at most 1 late] = 0.99^n + n * 0.01 * 0.99^(n - 1) must be under 0.01.
    def by_hand(n):
        return 0.99 ** n + n * 0.01 * 0.99 ** (n - 1)
    h = min_passing_queries(1)
    assert by_hand(h + 1) < 0.01 <= by_hand(h)
    assert h + 1 == 662  # LoadGen's "at least 662 queries" for a p99 estimate
    # at the 90th percentile: 0.9^n + n * 0.1 * 0.9^(n - 1) < 0.01 first at n = 64 (LoadGen's single-stream floor)
    assert min_passing_queries(1, 90.0) + 1 == 64
    assert 0.9 ** 64 + 64 * 0.1 * 0.9 ** 63 < 0.01 <= 0.9 ** 63 + 63 * 0.1 * 0.9 ** 62


def test_each_late_query_costs_more_queries():
    needed = [min_passing_queries(late) + late for late in range(5)]
    assert needed == [459, 662, 838, 1001, 1157]
    assert 1001 <= 1024 < 1157, "the default --min-queries 1024 lets early stopping pass with up to 3 late"


def test_early_stopping_verdict_and_estimate_on_a_point():
    latency = np.full(1000, 5.0)
    latency[:3] = 50.0  # three queries past a 10 ms bound
    verdict = early_stopping(latency, bound_ms=10.0)
    assert verdict.late_queries == 3 and verdict.queries_needed == 1001 and not verdict.met
    assert early_stopping(np.append(latency, 5.0), bound_ms=10.0).met
    # 1000 queries support t = 2 late (838 <= 1000 < 1001): LoadGen discards the largest t - 1 = 1 latency and
    # reads the next, the 2nd largest
    assert percentile_estimate(np.arange(1000.0)) == 998.0
    assert percentile_estimate(np.arange(1001.0)) == 998.0  # t = 3: the 3rd largest of 0..1000
    assert percentile_estimate(np.arange(661.0)) is None


def test_nearest_rank_percentile_is_one_real_latency_not_an_interpolation():
    values = np.arange(1.0, 101.0)
    assert nearest_rank(values, 99) == 99.0 and nearest_rank(values, 50) == 50.0 and nearest_rank(values, 100) == 100
    assert nearest_rank(np.array([1.0, 2.0, 3.0, 10.0]), 99) == 10.0  # np.percentile would say 9.79
    assert nearest_rank(np.arange(1.0, 1001.0), 99.9) == 999.0
    assert math.isnan(nearest_rank(np.array([]), 99))


def fixed_time_serve(tmp_path, **settings):
    """A model whose every batch takes 2 ms: its p99 is known, so only the run's length decides validity."""
    return serve(CPU_MLP, ServeConfig(p99_ms=50, max_batch=8, batch_timeout_ms=1, **settings), tmp_path,
                 engines=[FixedTimeEngine(0.002)])


def test_a_short_run_is_invalid_with_its_reasons(tmp_path):
    point = fixed_time_serve(tmp_path, qps="400", duration_s=0.2, min_queries=60).metrics.serve.points[0]
    validity = point.validity
    assert point.meets_bound and not validity.valid and not point.passed
    assert any(reason.startswith("early stopping not met: 0 of") and "need 459 queries" in reason
               for reason in validity.reasons), validity.reasons
    assert validity.early_stopping.queries < 459
    assert validity.too_short, "only its length made it INVALID: a longer run at 400 queries/s could pass"


def test_a_long_enough_run_is_valid(tmp_path):
    point = fixed_time_serve(tmp_path, qps="800", duration_s=0.8, min_queries=500).metrics.serve.points[0]
    assert point.validity == PointValidity(valid=True, reasons=[], flags=[],
                                           early_stopping=point.validity.early_stopping, too_short=False)
    assert point.passed and point.validity.early_stopping.met
    assert point.realised_offered_qps == pytest.approx(800, rel=0.1)


def test_minimum_duration_and_query_count_are_checked_where_the_schedule_cannot_meet_them(tmp_path):
    from perflab.serve.validity import point_validity
    point = LoadPoint(scenario="offline", duration_s=0.5, completed=100, latency_ms={"p99": 1.0})
    reasons = point_validity(point, np.ones(100), 0.0, 10.0, duration_s=2.0, min_queries=200).reasons
    assert reasons == ["minimum duration not met: the point lasted 0.50 s, under --duration 2 s",
                       "minimum query count not met: 100 completed, under --min-queries 200"]


def test_worst_dispatch_delay_beyond_the_bound_is_flagged_without_invalidating(tmp_path):
    from perflab.serve.validity import point_validity
    latency = np.full(500, 1.0)
    point = LoadPoint(scenario="server", duration_s=1.0, completed=500, latency_ms={"p99": 1.0},
                      dispatch_delay_ms=DispatchDelay(p99_ms=0.1, max_ms=30.0))
    validity = point_validity(point, latency, 1.0, 10.0, duration_s=1.0, min_queries=100)
    assert validity.valid and "worst dispatch delay 30.0 ms is beyond the 10 ms bound" in validity.flags[0]

import math

import pytest

from perflab.stats import bootstrap_ci, percentiles, summarize


def test_percentiles_interpolate_linearly():
    values = list(range(1, 101))
    result = percentiles(values)
    assert result["p50"] == pytest.approx(50.5)
    assert result["p95"] == pytest.approx(95.05)
    assert result["p99"] == pytest.approx(99.01)


def test_percentiles_of_nothing_are_nan():
    assert math.isnan(percentiles([])["p50"])


def test_summarize_reports_median_and_relative_spread():
    summary = summarize([100.0, 102.0, 98.0, 101.0, 99.0])
    assert summary["median"] == 100.0
    assert summary["min"] == 98.0 and summary["max"] == 102.0
    assert summary["range_pct"] == pytest.approx(4.0)
    assert summary["n"] == 5
    assert summary["ci95_low"] <= summary["median"] <= summary["ci95_high"]


def test_bootstrap_ci_is_degenerate_for_one_value():
    assert bootstrap_ci([7.0]) == (7.0, 7.0)


def test_bootstrap_ci_is_narrow_for_tight_data_and_wide_for_noisy_data():
    tight = bootstrap_ci([100.0, 100.1, 99.9, 100.05, 99.95])
    noisy = bootstrap_ci([80.0, 120.0, 95.0, 110.0, 100.0])
    assert tight[1] - tight[0] < 0.5
    assert noisy[1] - noisy[0] > 10


def test_bootstrap_ci_is_reproducible():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    assert bootstrap_ci(values) == bootstrap_ci(values)


def test_summarize_refuses_empty_input():
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_interval_of_a_clear_speedup_brackets_the_true_ratio_and_is_reproducible():
    from perflab.stats import bootstrap_ratio_ci

    base, candidate = [100.0, 101.0, 99.0, 100.5], [150.0, 151.0, 149.0, 150.5]
    low, high = bootstrap_ratio_ci(base, candidate)
    assert 1.45 < low <= 1.5 <= high < 1.55
    assert bootstrap_ratio_ci(base, candidate) == (low, high)  # seeded
    assert bootstrap_ratio_ci(base, candidate, seed=1) != (low, high)


def test_compare_uses_the_one_ratio_bootstrap():
    import perflab.compare.decision
    import perflab.stats

    assert perflab.compare.decision.bootstrap_ratio_ci is perflab.stats.bootstrap_ratio_ci

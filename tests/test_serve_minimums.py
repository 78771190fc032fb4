"""Serve's minimums follow LoadGen: a point runs until both --duration and --min-queries are met (and says so when
that took longer than --duration), and the max-QPS search never lowers the rate because a point was too short: a
point too short to show its p99 is rerun longer at the same rate; a point is invalid for latency, not for length."""
import json

import numpy as np
import pytest

from perflab.cli import main
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.report.serve_table import validity_lines
from perflab.results.metrics import LoadPoint, TriedRate
from perflab.serve import ServeConfig, serve
from perflab.serve.capacity import FixedTimeEngine
from perflab.serve.validity import point_validity, queries_to_show

TINY = ["serve", "--workload", "mlp", "--device", "cpu", "--warmup", "1", "--batcher-max-batch", "8"]
CPU_MLP = RunConfig(workload="mlp", device="cpu", warmup=1)


def test_a_point_shorter_than_min_queries_runs_until_the_count_is_met_and_says_so(tmp_path, capsys):
    out = tmp_path / "serve"
    # 200 queries/s for 0.5 s offer about 100 queries: the point runs on until 400 have arrived (about 2 s)
    assert main(TINY + ["--qps", "200", "--duration", "0.5", "--min-queries", "400", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    point = result["metrics"]["serve"]["points"][0]
    assert point["queries"] >= 400 and point["completed"] >= 400
    extended = point["extended"]
    assert extended["queries"] == point["queries"] and extended["queries_by_duration"] < 200
    assert extended["last_query_s"] > 1.0 and extended["duration_s"] == 0.5 and extended["why"] == "--min-queries 400"
    assert not any("minimum" in reason for reason in point["validity"]["reasons"]), point["validity"]["reasons"]
    notes = [note for note in result["notes"] if "ran past --duration" in note]
    assert len(notes) == 1 and "point 0 at 200 queries/s issued" in notes[0] and "--min-queries 400" in notes[0]
    assert "ran past --duration" in " ".join(printed.split())


def test_a_point_long_enough_at_its_duration_is_not_marked_extended(tmp_path):
    record = serve(CPU_MLP, ServeConfig(qps="400", duration_s=0.3, min_queries=40, max_batch=8, p99_ms=50,
                                        batch_timeout_ms=1), tmp_path, engines=[FixedTimeEngine(0.002)])
    assert record.metrics.serve.points[0].extended is None
    assert not any("ran past --duration" in note for note in record.notes)


def test_max_qps_search_with_points_too_short_finds_a_max_qps_instead_of_none(tmp_path):
    # 2 ms per batch of up to 8: about 4,000 queries/s, p99 far inside 50 ms at half that. A 0.2 s point at the
    # starting rate offers under 459 queries, too few for early stopping even with none late: the search used to
    # halve the rate (fewer queries still) down to its floor and report no max QPS.
    result = serve(CPU_MLP, ServeConfig(find_max_qps=True, p99_ms=50, duration_s=0.2, min_queries=60, max_batch=8,
                                        batch_timeout_ms=1, search_tolerance_pct=20), tmp_path,
                   engines=[FixedTimeEngine(0.002)])
    record = result.metrics.serve
    assert record.max_qps is not None and record.max_qps > 1000, record.search
    points = record.points
    too_short = [point for point in points if point.validity.too_short]
    assert too_short, "the first point should have been too short for early stopping"
    for point in too_short:  # rerun at the same rate with more queries, never answered by a lower rate
        rerun = points[point.rerun_as]
        assert rerun.offered_qps == point.offered_qps and rerun.queries > point.queries
        if rerun.overloaded is None:  # an overloaded rerun (a loaded machine) ended early: it ran past nothing
            assert rerun.extended.why.startswith(f"early stopping: point {point.index} had")
    tried = record.search.tried
    assert len(tried) == len(points) - len(too_short)
    assert tried[0] == TriedRate(qps=points[0].offered_qps, passed=True)
    failed = [point for point in points if not point.passed and point.rerun_as is None]
    assert all(not point.meets_bound or point.overloaded for point in failed), \
        "a rate fails for its latency, not for its length"
    assert sum("ran past --duration" in note for note in result.notes) == 1
    assert any(f"too short, not too slow: rerun longer as point {too_short[0].rerun_as}" in line
               for line in validity_lines(points))


def test_a_point_is_too_short_only_when_a_longer_run_at_its_rate_could_pass():
    def validity(latency_ms, **point):
        point = LoadPoint.from_dict({
            "scenario": "server", "completed": latency_ms.size,
            "latency_ms": {"p99": float(np.sort(latency_ms)[int(np.ceil(0.99 * latency_ms.size)) - 1])}, **point})
        return point_validity(point, latency_ms, 1.0, bound_ms=10.0, duration_s=1.0, min_queries=1)

    on_time = validity(np.full(300, 5.0))  # p99 within the bound, 300 < 459 queries
    assert not on_time.valid and on_time.too_short
    assert on_time.early_stopping.queries_to_show == 459
    slow = validity(np.full(300, 50.0))  # p99 past the bound: too slow, whatever the length
    assert not slow.valid and not slow.too_short
    late = np.full(1024, 5.0)
    late[:4] = 50.0  # 4 of 1,024 late: p99 met, early stopping needs more (1,157 for 4 late; more as late grow)
    few_late = validity(late)
    assert few_late.too_short and 1157 <= few_late.early_stopping.queries_to_show < 2000
    harness = validity(np.full(300, 5.0), harness_late=True, dispatch_delay_ms={"p99_ms": 3.0})
    assert not harness.too_short, "an invalid measurement is not made valid by running longer"
    assert queries_to_show(11, 1024) is None  # past 1% late: no length shows p99 within the bound


@pytest.mark.parametrize("settings, says", [
    (dict(qps="0.001", min_queries=100), "longer than a point may run"),  # 100,000 s to reach the count
    (dict(qps="1000000", duration_s=10.0), "more than the 2,000,000 perflab holds"),
])
def test_the_upper_bounds_of_a_point_stay(settings, says):
    with pytest.raises(PerflabError, match=says):
        ServeConfig(**settings).validate()

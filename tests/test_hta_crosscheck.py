"""HolisticTraceAnalysis as a cross-check of perflab's GPU busy/idle split and top kernels (benchmarks/bench_hta.py).

The tests that run HTA skip where it is not installed (`pip install 'perflab[hta]'`); the trace preparation and
perflab's side need no HTA.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from benchmarks.bench_hta import compare, fixture_traces, perflab_figures, prepare_trace_dir, top_kernels_agree

GPU = Path(__file__).parent / "fixtures" / "traces" / "gpu"


def test_prepared_trace_dir_holds_one_rank_file_and_leaves_the_fixture_untouched(tmp_path):
    trace = GPU / "sync__item_after_layer.json.gz"
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    (tmp_path / "rank-3.json").write_text("{}")  # a leftover would be read as another rank
    written = prepare_trace_dir(trace, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["rank-0.json"] == [written.name]
    data = json.loads(written.read_text())
    assert data["distributedInfo"] == {"rank": 0}
    with gzip.open(trace, "rt") as stream:
        assert len(data["traceEvents"]) == len(json.load(stream)["traceEvents"])
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before


def test_top_kernels_agree_by_order_then_by_set():
    assert top_kernels_agree([("a", 50), ("b", 30)], [("a", 49), ("b", 31)]) == "yes"
    assert top_kernels_agree([("a", 40), ("b", 39)], [("b", 40), ("a", 39)]) == "same set"
    assert top_kernels_agree([("a", 50)], [("c", 50)]) == "no"


def test_fixture_list_covers_the_gpu_and_pattern_traces():
    names = {p.parent.name for p in fixture_traces()}
    assert names == {"gpu", "patterns"} and len(fixture_traces()) >= 17


def test_perflab_side_names_the_work_hta_cannot_see():
    # compute__big_matmul: 2 of its 6 kernels were launched before the capture and run inside it
    figures = perflab_figures(GPU / "compute__big_matmul.json.gz")
    assert figures["busy_pct"] == pytest.approx(100, abs=0.5)
    assert figures["precapture_only_pct"] == pytest.approx(33.3, abs=1)
    assert figures["memset_only_pct"] == 0


def test_hta_agrees_with_perflab_busy_and_top_kernels_on_a_sync_bound_trace(tmp_path):
    pytest.importorskip("hta")
    record = compare(GPU / "sync__item_after_layer.json.gz", tmp_path)
    assert abs(record["diff_points"]) <= 2
    assert record["top_kernels_agree"] == "yes"
    ours, theirs = record["perflab"]["top_kernels"][0][1], record["hta"]["top_kernels"][0][1]
    assert ours == pytest.approx(theirs, abs=1)


def test_hta_differs_on_a_gpu_bound_trace_only_by_the_work_launched_before_the_capture(tmp_path):
    pytest.importorskip("hta")
    record = compare(GPU / "compute__big_matmul.json.gz", tmp_path)
    assert record["diff_points"] < -30  # HTA drops the pre-capture kernels ...
    assert abs(record["unexplained_points"]) <= 2  # ... and that is the whole difference
    assert record["top_kernels_agree"] == "yes"

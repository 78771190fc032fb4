"""Typed metrics: the Metrics tree round-trips through result.json, schema-1 files still load, and no module
indexes metrics by string key."""
import json
import re
from pathlib import Path

import pytest

from perflab.compare import compare_results, load_result
from perflab.results.metrics import (Distributed, Flops, Generation, Gpu, Interference, Latency, LoadPoint, Memory,
                             Metrics, RankFigures, Serve, ServeSettings, Throughput)
from perflab.results import SCHEMA_VERSION, Result

V1 = Path(__file__).parent / "fixtures" / "results" / "v1"
PACKAGE = Path(__file__).parent.parent / "perflab"


def full_metrics() -> Metrics:
    return Metrics(
        throughput_samples_per_s=Throughput(median=100.0, mean=101.0, min=90.0, max=110.0, stdev=5.0, range_pct=20.0,
                                            ci95_low=95.0, ci95_high=105.0, n=3),
        latency_ms=Latency(p50=10.0, p95=12.0, p99=13.0, mean=10.5, min=9.0, max=14.0),
        phases_ms={"forward": 4.0, "backward": 6.0}, phase_share_pct={"forward": 40.0, "backward": 60.0},
        batch_size=8, warmup_s=1.0, first_step_s=0.5,
        memory=Memory(peak_allocated_mb=100.0, peak_reserved_mb=120.0, device_total_mb=80000.0),
        gpu=Gpu(samples=10, util_mean_pct=90.0, clock_event_reasons=["SwPowerCap"]),
        flops=Flops(per_sample=1e9, achieved_tflops=0.1, peak_tflops=900.0, peak_source="calibrated", mfu_pct=0.01),
        interference=Interference(busy=True, busy_trials=[1], other_cpu_cores_max=1.5),
        steady=False,
        generation=Generation(requests=4, ttft_ms=Latency(p50=3.0), output_tokens_per_s=50.0),
        serve=Serve(scenario="server", settings=ServeSettings(max_batch=8, p99_ms=15.0),
                    points=[LoadPoint(index=0, latency_ms={"p99": 9.0})], max_qps=120.0),
        distributed=Distributed(world_size=2, per_rank=[RankFigures(rank=0, memory=Memory(host_peak_rss_mb=500.0)),
                                                        RankFigures(rank=1, memory=Memory(host_peak_rss_mb=510.0))]),
    )


def test_metrics_round_trip_through_json_unchanged():
    metrics = full_metrics()
    again = Metrics.from_dict(json.loads(json.dumps(metrics.to_dict())))
    assert again == metrics
    assert again.serve.settings.p99_ms == 15.0 and again.distributed.per_rank[1].memory.peak.mb == 510.0


def test_a_result_round_trips_its_metrics_through_result_json(tmp_path):
    result = Result(config={"workload": "mlp"}, environment={}, workload={}, trials=[], metrics=full_metrics())
    result.save(tmp_path)
    assert Result.load(tmp_path).metrics == result.metrics


def test_sections_a_run_does_not_have_are_left_out_of_the_json():
    data = Metrics(throughput_samples_per_s=Throughput(median=1.0), memory=Memory(host_peak_rss_mb=700.0)).to_dict()
    assert not {"generation", "serve", "distributed", "collectives", "profile", "steps_per_s"} & set(data)
    assert data["memory"] == {"host_peak_rss_mb": 700.0}  # the GPU figures of a CPU run are absent, as in schema 1
    assert data["gpu"] is None and data["latency_ms"] is None


def test_a_serve_point_reads_as_a_load_point_and_writes_the_keys_it_was_read_from():
    point = {"scenario": "server", "offered_qps": 100.0, "realised_offered_qps": 98.0, "achieved_qps": 97.5,
             "queries": 500, "completed": 500, "duration_s": 5.1, "latency_ms": {"p50": 2.0, "p99": 9.0, "p99.9": 11.0},
             "time_ms": {"mean": {"compute": 1.0}, "tail": {"compute": 3.0}}, "batches": 80,
             "batch_histogram": {"4": 80}, "batch_mean": 4.0, "batch_fill_pct": 50.0, "instance_busy_pct": 40.0,
             "dispatch_delay_ms": {"p99_ms": 0.2, "max_ms": 0.9}, "harness_late": False, "gpu": None,
             "cost_per_million_queries": None, "index": 0, "schedule_seed": 1, "load_generator": "perflab",
             "meets_bound": True, "validity": {"valid": True, "reasons": []}, "passed": True, "padded_samples": 0,
             "a_future_key": 1}
    loaded = Metrics.from_dict({"serve": {"points": [point]}}).serve.points[0]
    assert isinstance(loaded, LoadPoint) and loaded.p99_ms == 9.0 and loaded.dispatch_delay_ms.p99_ms == 0.2
    assert loaded.offered == 98.0 and loaded.extra == {"a_future_key": 1}
    assert loaded.to_dict() == point, "the same keys and values, none added"


def test_keys_this_perflab_does_not_know_are_kept():
    data = {"throughput_samples_per_s": {"median": 2.0, "harmonic": 1.9}, "a_plugins_figure": 7}
    assert Metrics.from_dict(data).to_dict()["a_plugins_figure"] == 7
    assert Metrics.from_dict(data).to_dict()["throughput_samples_per_s"]["harmonic"] == 1.9


def test_peak_memory_falls_back_to_the_host_rss_in_one_place():
    assert Memory(peak_allocated_mb=3.0, host_peak_rss_mb=9.0).peak.on_gpu
    assert Memory(host_peak_rss_mb=9.0).peak.mb == 9.0 and not Memory(host_peak_rss_mb=9.0).peak.on_gpu
    assert Metrics().peak_memory.mb is None


@pytest.mark.parametrize("run", ["run-train", "run-infer"])
def test_a_schema_1_result_loads_into_typed_metrics(run):
    raw = json.loads((V1 / run / "result.json").read_text())
    assert raw["schema_version"] == 1
    result = Result.load(V1 / run)
    assert result.schema_version == SCHEMA_VERSION
    assert result.throughput == raw["metrics"]["throughput_samples_per_s"]["median"]
    assert result.metrics.latency_ms.p95 == raw["metrics"]["latency_ms"]["p95"]
    assert result.metrics.phases_ms == raw["metrics"]["phases_ms"]
    assert result.metrics.interference.busy == raw["metrics"]["interference"]["busy"]
    assert result.peak_memory.mb == raw["metrics"]["memory"]["host_peak_rss_mb"]


def test_a_schema_1_result_is_written_back_with_the_same_metrics_keys(tmp_path):
    raw = json.loads((V1 / "run-train" / "result.json").read_text())
    Result.load(V1 / "run-train").save(tmp_path)
    again = json.loads((tmp_path / "result.json").read_text())
    assert again["schema_version"] == SCHEMA_VERSION
    assert again["metrics"] == raw["metrics"]


def test_compare_takes_schema_1_results_and_a_schema_1_comparison_still_reports(tmp_path):
    base, cand = load_result(V1 / "run-train"), load_result(V1 / "run-train")
    comparison = compare_results(base, cand, accept_noisy=True)
    assert comparison.metric("throughput").change_pct == pytest.approx(0.0)
    from perflab.report.build import write_report
    written = write_report(V1 / "compare", tmp_path / "report")
    assert any(Path(path).name == "report.md" for path in written)
    assert "throughput" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("folder", ["run-train", "sweep"])
def test_report_reads_schema_1_run_and_sweep_folders(tmp_path, folder):
    from perflab.report.build import write_report
    written = write_report(V1 / folder, tmp_path / "report")
    assert written and "samples/s" in (tmp_path / "report" / "report.md").read_text()


def test_rerun_repeats_a_schema_1_run_and_compares_with_it(tmp_path, capsys):
    from perflab.cli import main
    assert main(["rerun", str(V1 / "run-infer"), "--out", str(tmp_path / "again")]) == 0
    assert "vs the original: throughput" in capsys.readouterr().out
    assert json.loads((tmp_path / "again" / "result.json").read_text())["schema_version"] == SCHEMA_VERSION


STRING_KEY_INDEXING = re.compile(r"""metrics\[["']|metrics\.get\(|\.metrics\s*\[""")


def test_no_module_indexes_metrics_by_string_key():
    assert all(STRING_KEY_INDEXING.search(line) for line in (
        'result.metrics["latency_ms"]["p50"]', "ctx.metrics.get('gpu')", "metrics['steady']"))
    sources = sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "benchmarks").rglob("*.py")])
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
             for path in sources
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if STRING_KEY_INDEXING.search(line)]
    assert not found, "index metrics by attribute (perflab/results/metrics.py), not by string key:\n" + "\n".join(found)


def stored_results() -> list[Path]:
    """Every result.json kept in this repository: examples, benchmark records, fixtures (schema 1 and later)."""
    root = PACKAGE.parent
    return sorted(path for folder in ("docs", "benchmarks", "tests/fixtures") for path in (root / folder).rglob(
        "result.json"))


def without_empty(value):
    """JSON with null and {} values dropped: schema 2 leaves a missing section out where schema 1 wrote null."""
    if isinstance(value, dict):
        return {key: without_empty(item) for key, item in value.items() if item is not None and item != {}}
    if isinstance(value, list):
        return [without_empty(item) for item in value]
    return value


def test_every_stored_result_loads_and_keeps_its_metrics():
    paths = stored_results()
    assert len(paths) >= 10
    for path in paths:
        raw = json.loads(path.read_text())
        result = Result.load(path)
        assert without_empty(result.metrics.to_dict()) == without_empty(raw["metrics"]), path


def test_a_schema_1_distributed_result_reads_its_ranks_as_typed_figures():
    result = Result.load(V1 / "run-nproc2")
    dist = result.metrics.distributed
    assert result.world_size == 2 and dist.world_size == 2 and len(dist.per_rank) == 2
    assert [rank.rank for rank in dist.per_rank] == [0, 1]
    assert all(rank.memory.peak.mb > 0 and not rank.memory.peak.on_gpu for rank in dist.per_rank)
    assert result.metrics.global_batch_size == 2 * result.config.batch_size


def test_a_result_whose_metrics_are_not_an_object_says_so(tmp_path):
    from perflab.errors import PerflabError
    data = json.loads((V1 / "run-train" / "result.json").read_text())
    data["metrics"] = [1, 2]
    (tmp_path / "result.json").write_text(json.dumps(data))
    with pytest.raises(PerflabError, match="malformed metrics"):
        Result.load(tmp_path)

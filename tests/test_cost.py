"""--gpu-cost-per-hour: the cost of a million samples in run results, compare and report."""
import pytest

import perflab
from perflab.cli import main
from perflab.compare import compare_results
from perflab.config import RunConfig
from perflab.report.markdown import run_summary_rows

TINY = dict(workload="mlp", device="cpu", steps=3, trials=2, warmup=1)


def test_run_reports_the_cost_of_a_million_samples_and_compare_weighs_two_prices(tmp_path, capsys):
    cheap = perflab.run(config=RunConfig(**TINY, gpu_cost_per_hour=2.0))
    dear = perflab.run(config=RunConfig(**TINY, gpu_cost_per_hour=4.0))
    expected = 2.0 / 3600 / cheap.throughput * 1e6
    assert cheap.metrics.cost_per_million_samples == pytest.approx(expected)
    assert any(row[0] == "cost" for row in run_summary_rows(cheap))
    cost = compare_results(cheap, dear).metric("cost per million samples")
    assert cost.base == pytest.approx(expected) and cost.candidate > cost.base
    assert perflab.run(config=RunConfig(**TINY)).metrics.cost_per_million_samples is None


def test_gpu_cost_per_hour_must_be_positive(capsys):
    assert main(["run", "--workload", "mlp", "--device", "cpu", "--gpu-cost-per-hour", "0"]) == 2
    assert "--gpu-cost-per-hour must be a positive number" in capsys.readouterr().err

"""The report's plots: y from zero with headroom, legends only for several series, clean labels, whole counts."""
import pytest

from perflab.report.plots import HEADROOM, latency_figure, phase_breakdown_figure, sweep_figures


def point(batch: int, throughput: float, precision: str = "fp32", status: str = "ok") -> dict:
    return {"params": {"batch_size": batch, "precision": precision}, "status": status, "throughput": throughput,
            "p50_ms": 1000 * batch / throughput, "p95_ms": 1100 * batch / throughput,
            "peak_memory_mb": 100.0 + batch, "memory_kind": "host peak RSS (whole process)"}


ONE_SERIES = [point(8, 400.0), point(16, 700.0), point(32, 900.0)]
TWO_SERIES = ONE_SERIES + [point(8, 600.0, "bf16"), point(16, 1100.0, "bf16"), point(32, 1500.0, "bf16")]


def test_line_plots_start_at_zero_and_end_above_the_highest_point():
    ax = sweep_figures(ONE_SERIES, ["batch_size"])["throughput"][1].axes[0]
    bottom, top = ax.get_ylim()
    assert bottom == 0
    assert top == pytest.approx(900.0 * HEADROOM)


def test_one_series_has_no_legend_and_several_have_one_without_all():
    single = sweep_figures(ONE_SERIES, ["batch_size"])
    assert single["throughput"][1].axes[0].get_legend() is None
    latency_labels = [t.get_text() for t in single["latency"][1].axes[0].get_legend().get_texts()]
    assert latency_labels == ["p50", "p95"]  # two curves of one series: named by the curve alone
    several = sweep_figures(TWO_SERIES, ["batch_size", "precision"])["throughput"][1].axes[0]
    labels = [t.get_text() for t in several.get_legend().get_texts()]
    assert labels == ["precision=fp32", "precision=bf16"]


def test_memory_axis_reads_as_a_unit_and_the_title_says_what_was_measured():
    ax = sweep_figures(ONE_SERIES, ["batch_size"])["memory"][1].axes[0]
    assert ax.get_ylabel() == "peak memory (MiB)"
    assert ax.get_title() == "peak memory vs batch: host peak RSS (whole process)"


def test_latency_histogram_counts_steps_in_whole_numbers_from_zero():
    ax = latency_figure({"batch 8": [2.0, 2.1, 3.5]}).axes[0]
    ticks = [tick for tick in ax.get_yticks() if ax.get_ylim()[0] <= tick <= ax.get_ylim()[1]]
    assert ticks and all(float(tick).is_integer() for tick in ticks)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 1
    assert ax.get_legend() is None  # one run: nothing to tell apart


def test_latency_histogram_of_two_runs_has_a_legend():
    ax = latency_figure({"baseline": [2.0, 2.2], "candidate": [1.0, 1.1]}).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["baseline", "candidate"]


def test_phase_bars_end_inside_the_frame():
    ax = phase_breakdown_figure({"run": {"forward": 3.0, "backward": 5.0, "data_wait": 2.0}}).axes[0]
    assert ax.get_xlim()[1] > 10.0

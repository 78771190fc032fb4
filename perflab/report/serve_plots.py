"""Plots of a serve result: latency percentiles against offered load, batch fill, and where a query's time goes."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from perflab.results.metrics import LoadPoint, Serve
from perflab.report.plots import new_figure
from perflab.serve.metrics import COMPONENTS

PERCENTILE_STYLES = (("p50", "-"), ("p90", "--"), ("p99", "-."), ("p99.9", ":"))
PALETTE = ("#d62728", "#ff7f0e", "#8c564b", "#bcbd22", "#1f77b4", "#17becf", "#7f7f7f", "#e377c2")
PART_COLORS = dict(zip(COMPONENTS, PALETTE))  # a query's parts, in the order of its life


def _label(point: LoadPoint) -> str:
    if point.offered_qps is None:
        return f"#{point.index} {point.scenario}"
    return f"{point.offered_qps:,.0f} q/s"


def latency_vs_load(serve: Serve, path: Path, title: str = "") -> Optional[Path]:
    """p50/p90/p99/p99.9 against the offered rate of the server points, with the bound and the max QPS."""
    points = sorted((p for p in serve.points if p.scenario == "server"), key=lambda p: p.offered_qps)
    if not points:
        return None
    fig = new_figure(7, 4.2)
    ax = fig.subplots()
    rates = [p.offered_qps for p in points]
    for key, style in PERCENTILE_STYLES:
        ax.plot(rates, [p.latency_ms[key] for p in points], style, marker="o", markersize=3, label=key)
    bound = serve.settings.p99_ms
    ax.axhline(bound, color="black", linewidth=0.8, label=f"p99 bound {bound:g} ms")
    if serve.max_qps:
        ax.axvline(serve.max_qps, color="green", linewidth=0.8, linestyle="--",
                   label=f"max QPS {serve.max_qps:,.0f}")
    for label, marker, color, chosen in (
            ("p99 over the bound", "x", "red", [p for p in points if not p.meets_bound]),
            ("harness late (invalid)", "^", "orange", [p for p in points if p.harness_late])):
        if chosen:
            ax.plot([p.offered_qps for p in chosen], [p.p99_ms for p in chosen], linestyle="none",
                    marker=marker, color=color, markerfacecolor="none", markersize=9, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (queries/s, Poisson arrivals)")
    ax.set_ylabel("latency ms (log)")
    ax.set_title(title or "latency vs offered load")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    return path


def batch_fill(serve: Serve, path: Path) -> Optional[Path]:
    """Share of batches of each size, one line per point."""
    points = serve.points
    if not points:
        return None
    fig = new_figure(7, 3.6)
    ax = fig.subplots()
    for point in points:
        histogram = {int(size): count for size, count in point.batch_histogram.items()}
        total = sum(histogram.values()) or 1
        sizes = sorted(histogram)
        ax.plot(sizes, [100 * histogram[s] / total for s in sizes], marker="o", markersize=3,
                label=f"{_label(point)} (fill {point.batch_fill_pct:.0f}%)")
    ax.set_xlabel(f"batch size (max {serve.settings.max_batch})")
    ax.set_ylabel("% of batches")
    ax.set_title("batch fill")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def time_breakdown(serve: Serve, path: Path) -> Optional[Path]:
    """Stacked bars per point: a query's mean time in each part, on average and in the p99 tail."""
    points = sorted(serve.points, key=lambda p: (p.offered_qps is not None, p.offered_qps or 0))
    if not points:
        return None
    fig = new_figure(7, 1.6 + 0.5 * len(points))
    axes = fig.subplots(1, 2, sharey=True)
    labels = [_label(p) for p in points]
    for ax, which, title in ((axes[0], "mean", "all queries (mean)"), (axes[1], "tail", "p99 tail (mean)")):
        left = [0.0] * len(points)
        for part, color in PART_COLORS.items():
            widths = [p.time_ms[which].get(part, 0.0) for p in points]
            ax.barh(labels, widths, left=left, color=color, label=part.replace("_", " "))
            left = [a + b for a, b in zip(left, widths)]
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("ms per query")
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("where a query's time goes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    return path


def serve_plots(serve: Serve, out: Path, title: str = "") -> dict[str, Optional[Path]]:
    out = Path(out)
    return {"latency": latency_vs_load(serve, out / "serve_latency_vs_load.png", title),
            "fill": batch_fill(serve, out / "serve_batch_fill.png"),
            "breakdown": time_breakdown(serve, out / "serve_time_breakdown.png")}

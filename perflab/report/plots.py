"""PNG plots (matplotlib's Agg canvas, no display needed): sweep and scaling curves, step-time breakdowns, latency
histograms, tune's waterfall: presentation, embedded in the reports. A driver that draws while it runs (a sweep, a
scale) is handed sweep_plots / scaling_plots by its caller, so that it never imports report/."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from perflab.step.phases import phase_sort_key
from perflab.sweep.point import value_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PHASE_COLORS = {"data_wait": "#d62728", "h2d": "#ff7f0e", "augment": "#bcbd22", "forward": "#1f77b4",
                "backward": "#2ca02c", "optimizer": "#9467bd", "step": "#17becf", "checkpoint": "#8c564b",
                "unattributed": "#c7c7c7"}
DPI = 110
HEADROOM = 1.12  # the y axis ends this far above the highest point, so no line runs along the frame


def new_figure(width: float, height: float) -> "Figure":
    """An Agg figure. matplotlib is imported here, not with the module: it costs a third of a second, and most
    perflab processes (every tune trial, every rank) draw nothing."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=DPI)


def _x_axis(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> str:
    return "batch_size" if "batch_size" in axes or not axes else axes[0]


def _series(rows: Sequence[dict[str, Any]], axes: Sequence[str], x_name: str) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by the values of every swept axis except the x axis: one line per group ("" if one group)."""
    others = [name for name in axes if name != x_name]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        label = ", ".join(f"{name.replace('_size', '')}={value_text(row['params'].get(name))}" for name in others)
        groups.setdefault(label, []).append(row)
    return groups


def _legend_if_several(ax, **options) -> None:
    """A legend only when there is something to tell apart: one series needs none."""
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) > 1:
        ax.legend(handles, labels, **options)


def _y_from_zero(ax, tops: Sequence[float]) -> None:
    """y from 0 to a little above the highest value."""
    top = max([value for value in tops if value is not None] or [0.0])
    ax.set_ylim(0, top * HEADROOM if top > 0 else 1.0)


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _line_figure(rows: Sequence[dict[str, Any]], axes: Sequence[str], title: str, ylabel: str,
                 curves: Sequence[tuple[str, str, str]]) -> Figure:
    """One line per group and per (metric key, suffix, linestyle) in `curves`; OOM points marked with x."""
    x_name = _x_axis(rows, axes)
    fig = new_figure(7, 4.2)
    ax = fig.subplots()
    xs_all = [row["params"].get(x_name) for row in rows]
    numeric = _numeric(xs_all)
    tops: list[float] = []
    for color_index, (group, members) in enumerate(_series(rows, axes, x_name).items()):
        color = f"C{color_index % 10}"
        ok = [row for row in members if row["status"] == "ok"]
        if numeric:
            ok.sort(key=lambda row: row["params"][x_name])
        xs = [row["params"][x_name] if numeric else value_text(row["params"][x_name]) for row in ok]
        for key, suffix, style in curves:
            ys = [row.get(key) for row in ok]
            if xs and all(y is not None for y in ys):
                ax.plot(xs, ys, style, color=color, marker="o", label=f"{group}{suffix}".strip())
                tops += ys
        oom = [row["params"][x_name] if numeric else value_text(row["params"][x_name]) for row in members
               if row["status"] == "oom"]
        if oom:
            ax.plot(oom, [0] * len(oom), linestyle="none", marker="x", markersize=10, color=color,
                    label=f"{group}: out of memory" if group else "out of memory")
    if numeric and xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 4:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs_all))
        ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel(x_name.replace("_", " "))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _y_from_zero(ax, tops)
    ax.grid(True, alpha=0.3)
    _legend_if_several(ax, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def sweep_figures(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> dict[str, tuple[str, Figure]]:
    """name -> (PNG file name, figure): throughput, p50/p95 latency and peak memory against the batch size
    (or the first swept axis)."""
    x_name = _x_axis(rows, axes).replace("_size", "")
    memory_kind = next((row.get("memory_kind") for row in rows if row["status"] == "ok"), None)
    return {
        "throughput": (f"throughput_vs_{x_name}.png", _line_figure(
            rows, axes, f"throughput vs {x_name}", "samples/s (median of trials)", [("throughput", "", "-")])),
        "latency": (f"latency_vs_{x_name}.png", _line_figure(
            rows, axes, f"step latency vs {x_name}", "ms per step", [("p50_ms", " p50", "-"), ("p95_ms", " p95", "--")])),
        "memory": (f"memory_vs_{x_name}.png", _line_figure(
            rows, axes, f"peak memory vs {x_name}" + (f": {memory_kind}" if memory_kind else ""), "peak memory (MiB)",
            [("peak_memory_mb", "", "-")])),
    }


def sweep_plots(rows: Sequence[dict[str, Any]], axes: Sequence[str], out: Path) -> dict[str, Path]:
    """Write the sweep's figures as PNGs in `out`; returns name -> path."""
    paths = {}
    for name, (file_name, fig) in sweep_figures(rows, axes).items():
        paths[name] = Path(out) / file_name
        fig.savefig(paths[name])
    return paths


def phase_breakdown_plot(breakdowns: dict[str, dict[str, float]], path: Path,
                         title: str = "step-time breakdown (mean per step)") -> Path:
    """Write the phase breakdown figure as a PNG at `path`."""
    phase_breakdown_figure(breakdowns, title).savefig(path, bbox_inches="tight")
    return path


def phase_breakdown_figure(breakdowns: dict[str, dict[str, float]],
                           title: str = "step-time breakdown (mean per step)") -> Figure:
    """One horizontal stacked bar per label (a run, or base and candidate) of phase milliseconds."""
    names = sorted({name for phases in breakdowns.values() for name in phases}, key=phase_sort_key)
    fig = new_figure(7, 1.2 + 0.7 * len(breakdowns))
    ax = fig.subplots()
    labels = list(breakdowns)
    left = [0.0] * len(labels)
    for index, name in enumerate(names):
        widths = [breakdowns[label].get(name, 0.0) for label in labels]
        ax.barh(labels, widths, left=left, label=name, color=PHASE_COLORS.get(name, f"C{index % 10}"))
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * HEADROOM if left and max(left) > 0 else 1.0)  # bars end inside the frame
    ax.set_xlabel("ms per step")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def latency_histogram(step_ms: dict[str, Sequence[float]], path: Path) -> Optional[Path]:
    """Write the latency histogram as a PNG at `path`; None (and no file) when there are no steps."""
    fig = latency_figure(step_ms)
    if fig is None:
        return None
    fig.savefig(path)
    return path


def latency_figure(step_ms: dict[str, Sequence[float]]) -> Optional[Figure]:
    """Distribution of per-step latency (one histogram per label), with p50 and p95 marked."""
    import numpy as np

    values = {label: list(ms) for label, ms in step_ms.items() if len(ms)}
    if not values:
        return None
    fig = new_figure(7, 3.4)
    ax = fig.subplots()
    everything = np.concatenate([np.asarray(v) for v in values.values()])
    bins = np.linspace(everything.min(), everything.max() or 1.0, 40)
    tops = []
    for index, (label, ms) in enumerate(values.items()):
        color = f"C{index}"
        counts, _, _ = ax.hist(ms, bins=bins, alpha=0.5, color=color, label=label)
        tops.append(float(counts.max()))
        for point, style in ((50, "-"), (95, "--")):
            ax.axvline(float(np.percentile(ms, point)), color=color, linestyle=style, linewidth=1)
    ax.set_xlabel("ms per step (solid: p50, dashed: p95)")
    ax.set_ylabel("steps")
    _y_from_zero(ax, tops)
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of steps: no fractional ticks
    ax.set_title("per-step latency")
    _legend_if_several(ax, fontsize=7)
    fig.tight_layout()
    return fig



def waterfall_plot(start_label: str, start_value: float, steps: Sequence[tuple[str, float]], path: Path,
                   unit: str = "samples/s") -> Path:
    """Throughput of the start, then each kept lever's gain as a floating bar, then the total."""
    fig = new_figure(max(5.0, 1.2 * (len(steps) + 2)), 3.8)
    ax = fig.subplots()
    labels = [start_label] + [label for label, _ in steps] + ["tuned"]
    ax.bar(0, start_value, color="#8c8c8c")
    level = start_value
    for index, (_, value) in enumerate(steps, start=1):
        gain = value - level
        ax.bar(index, gain, bottom=level, color="#2ca02c" if gain >= 0 else "#d62728")
        ax.text(index, max(level, value), f"{100 * gain / level:+.0f}%" if level else "", ha="center",
                va="bottom", fontsize=8)
        level = value
    ax.bar(len(labels) - 1, level, color="#1f77b4")
    if start_value:
        ax.text(len(labels) - 1, level, f"{level / start_value:.2f}×", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title("tune: throughput gained by each kept lever")
    fig.tight_layout()
    fig.savefig(path)
    return path
def scaling_plots(rows: Sequence[dict[str, Any]], axes: Sequence[str], out: Path) -> dict[str, Path]:
    """Per-rank throughput and scaling efficiency against the number of ranks (perflab scale), as PNGs in `out`."""
    figures = {
        "per_rank_throughput": ("per_rank_throughput_vs_nproc.png", _line_figure(
            rows, axes, "throughput per rank vs ranks (flat = perfect scaling)", "samples/s per rank",
            [("per_rank_throughput", "", "-")])),
        "efficiency": ("scaling_efficiency_vs_nproc.png", _line_figure(
            rows, axes, "scaling efficiency: throughput(N) / (N x throughput(1))", "% of linear",
            [("efficiency_pct", "", "-")])),
    }
    paths = {}
    for name, (file_name, fig) in figures.items():
        paths[name] = Path(out) / file_name
        fig.savefig(paths[name])
    return paths

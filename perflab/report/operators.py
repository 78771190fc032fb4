"""The operator view in words and pictures: top ops in <= 80 columns for the terminal, Markdown tables of top ops,
modules and kernels for the report, and a bar chart of the top ops coloured by their roofline place."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from perflab.diagnose.operators import OperatorRow, OperatorView

BOUND_COLORS = {"compute": "#1f77b4", "bandwidth": "#ff7f0e", "latency": "#d62728", "unknown": "#9e9e9e"}
BOUND_LABELS = {"compute": "compute-bound", "bandwidth": "bandwidth-bound", "latency": "latency-bound / too small",
                "unknown": "no ceiling known"}
WIDTH = 80


def _cut(text: Optional[str], width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _tail(text: Optional[str], width: int) -> str:
    """The end of a dotted path, which names the innermost module: '…Block_4.Linear_13'."""
    text = text or "-"
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _as_view(view: Union[OperatorView, dict[str, Any], None]) -> Optional[OperatorView]:
    """The operator view, also from the dict a result.json or diagnosis.json holds ({} or None: no view)."""
    if isinstance(view, dict):
        return OperatorView.from_dict(view) if view else None
    return view


def _rate(row: OperatorRow) -> str:
    """Achieved FLOP/s for ops that do math, else bytes/s; at most 10 characters."""
    if row.gflop_per_step > 0.001:
        tflops = row.achieved_tflops
        return f"{tflops:.1f} TF/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GF/s"
    gbps = row.achieved_gbps or 0.0
    return f"{gbps:.0f} GB/s" if gbps >= 1 else (f"{gbps * 1e3:.0f} MB/s" if gbps else "-")


def top_ops_lines(view: Union[OperatorView, dict[str, Any], None], top: int = 5) -> list[str]:
    """The top ops, one line each, at most 80 columns: share, ms/step, op, module, rate, bound."""
    view = _as_view(view)
    if view is None or not view.ops:
        return []
    lines = [_cut(f"top ops by {view.time_source} ({view.device_ms_per_step:.3g} ms per step):", WIDTH),
             f"{'share':>6} {'ms/step':>8}  {'op':<22} {'module':<18} {'rate':>10} {'bound':<9}"]
    for row in view.ops[:top]:
        line = (f"{row.share_pct:5.1f}% {row.ms_per_step:8.3g}  {_cut(row.op.removeprefix('aten::'), 22):<22} "
                f"{_tail(row.module, 18):<18} {_rate(row):>10} {row.bound:<9}")
        lines.append(line[:WIDTH].rstrip())
    return lines


def operators_markdown(view: Union[OperatorView, dict[str, Any], None], top: int = 8) -> str:
    """Markdown tables: top ops (with FLOPs, bytes, rates and bound), top modules, top kernels."""
    view = _as_view(view)
    if view is None or not view.ops:
        return ""
    lines = ["### Top ops", "",
             f"Device time from {view.time_source}, {view.device_ms_per_step:.3g} ms per step; ceilings: "
             f"{view.ceiling_source}.", "",
             "| op | module | line | calls/step | ms/step | share | GFLOP/step | MB/step | TFLOP/s | GB/s | bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in view.ops[:top]:
        lines.append(f"| `{row.op}` | {row.module} | {row.line or '-'} | {row.calls_per_step:.3g} | "
                     f"{row.ms_per_step:.3g} | {row.share_pct:.1f}% | {row.gflop_per_step:.3g} | "
                     f"{row.mb_per_step:.3g} | {row.achieved_tflops:.3g} | {row.achieved_gbps:.3g} | "
                     f"{BOUND_LABELS.get(row.bound, row.bound)} |")
    if view.modules:
        lines += ["", "| module | ms/step | share | top op |", "|---|---|---|---|"]
        lines += [f"| {m.module} | {m.ms_per_step:.3g} | {m.share_pct:.1f}% | `{m.top_op}` |"
                  for m in view.modules[:top]]
    if view.kernels:
        lines += ["", "| kernel | share | ms/step | instances/step | avg µs | med µs | min µs | max µs |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| `{_cut(k.name, 70)}` | {k.share_pct:.1f}% | {k.ms_per_step:.3g} | "
                  f"{k.instances_per_step:.3g} | {k.avg_us:.3g} | {k.med_us:.3g} | {k.min_us:.3g} | "
                  f"{k.max_us:.3g} |" for k in view.kernels[:top]]
    lines.append("")
    return "\n".join(lines)


def top_ops_plot(view: Union[OperatorView, dict[str, Any], None], path: Path, top: int = 10) -> Optional[Path]:
    """Horizontal bars of the top ops' share of device time, coloured by roofline place; None without ops."""
    view = _as_view(view)
    if view is None or not view.ops:
        return None
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = view.ops[:top][::-1]
    figure = Figure(figsize=(8, 0.45 * len(rows) + 1.4), dpi=110)
    ax = figure.subplots()
    labels = [_cut(f"{r.op.removeprefix('aten::')} · {r.module}", 48) for r in rows]
    ax.barh(labels, [r.share_pct for r in rows], color=[BOUND_COLORS.get(r.bound, "#9e9e9e") for r in rows])
    ax.set_xlabel(f"share of device time ({view.time_source})")
    ax.set_title("top ops by device time, coloured by roofline place")
    seen = list(dict.fromkeys(r.bound for r in rows))
    ax.legend(handles=[Patch(color=BOUND_COLORS.get(b, "#9e9e9e"), label=BOUND_LABELS.get(b, b)) for b in seen],
              loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path

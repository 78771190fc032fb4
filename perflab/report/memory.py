"""The memory report: the step's memory over time by category (PNG) and memory.json as Markdown."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from perflab.memory.breakdown import Breakdown
from perflab.memory.search import search_bound
from perflab.memory.timeline import CATEGORIES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from perflab.memory.study import MemoryStudy

MEMORY_PLOT = "memory_timeline.png"
COLOURS = {"parameters": "#2e7d32", "gradients": "#1565c0", "optimizer_state": "#f9a825", "activations": "#c62828",
           "inputs": "#424242", "temporaries": "#8e24aa"}


def memory_timeline_plot(breakdown: Breakdown, path: Path) -> Optional[Path]:
    """Stacked areas of each category over the step, with the measured peak as a line; None without a timeline."""
    timeline = breakdown.category_timeline()
    if timeline is None or len(timeline.times_ms) < 2:
        return None
    from matplotlib.figure import Figure  # imported when drawn: most processes draw nothing
    figure = Figure(figsize=(9, 4.5))
    ax = figure.subplots()
    ax.stackplot(timeline.times_ms, *[timeline.mb[name] for name in CATEGORIES],
                 labels=[name.replace("_", " ") for name in CATEGORIES], colors=[COLOURS[n] for n in CATEGORIES],
                 step="post", alpha=0.85)
    ax.axhline(breakdown.peak_mb, color="black", linestyle="--", linewidth=1,
               label=f"measured peak {breakdown.peak_mb:,.0f} MiB")
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("MiB")
    ax.set_ylim(0, breakdown.peak_mb * 1.15 or 1)
    ax.set_title(f"{breakdown.workload} {breakdown.mode}, batch {breakdown.batch_size}: memory over one step")
    ax.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _mb(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:,.1f}"


def memory_markdown(study: MemoryStudy, image: Optional[str]) -> str:
    """memory.json (perflab.memory.study.MemoryStudy) as a Markdown report."""
    breakdown = study.breakdown
    lines = [f"# Memory: {breakdown.workload} {breakdown.mode}, batch {breakdown.batch_size} ({breakdown.device})", "",
             f"Measured peak **{breakdown.peak_mb:,.1f} MiB** ({breakdown.peak_source}). Categories: "
             f"{breakdown.source}.", "", "| category | MiB | share of peak |", "|---|---:|---:|"]
    for label, mb in breakdown.rows():
        share = 100 * mb / breakdown.peak_mb if breakdown.peak_mb else 0.0
        lines.append(f"| {label} | {mb:,.1f} | {share:.0f}% |")
    largest = breakdown.largest_module()
    if largest:
        lines += ["", f"Largest activations: `{largest[0]}` ({largest[1]:,.1f} MiB saved for backward)."]
    if image:
        lines += ["", f"![memory over the step]({image})"]
    fit = study.fit
    if fit:
        lines += ["", "## The peak at other batches", "",
                  f"peak ≈ {fit.fixed_mb:,.1f} MiB + {fit.per_sample_mb:,.3f} MiB × batch "
                  f"({fit.basis or 'least squares over batches ' + ', '.join(map(str, fit.batches))}); "
                  f"capacity {_mb(study.capacity_mb)} MiB; "
                  f"predicted largest batch: {study.predicted_largest_batch or '—'}."]
    search = study.search
    if search:
        predicted = fit.predict_mb(search.largest_fits) if fit is not None and search.largest_fits else None
        lines += ["", f"Largest batch that fits (measured, each probe its own process): **{search.largest_fits}** "
                  f"({search_bound(search.limited_by, search.smallest_oom)}); peak there "
                  f"{_mb(search.largest_peak_mb)} MiB measured vs {_mb(predicted)} MiB predicted.", "",
                  "| probe batch | status | peak MiB |", "|---:|---|---:|"]
        lines += [f"| {p.batch} | {p.status} | {_mb(p.peak_mb)} |" for p in search.probes]
    if study.levers:
        lines += ["", "## What each lever would free", "", "| lever | how | predicted peak MiB | frees MiB | "
                  "batch it allows | basis |", "|---|---|---:|---:|---:|---|"]
        for lever in study.levers:
            basis = lever.basis + (f" ({lever.note})" if lever.note else "")
            lines.append(f"| {lever.lever} | `{lever.how}` | {_mb(lever.predicted_peak_mb)} | "
                         f"{_mb(lever.frees_mb)} | {lever.batch_allowed or '—'} | {basis} |")
    if study.files.get("snapshot"):
        lines += ["", f"Allocator snapshot: `{study.files['snapshot']}` (drag onto https://pytorch.org/memory_viz)."]
    lines += [f"- {note}" for note in breakdown.notes]
    return "\n".join(lines) + "\n"

"""The terminal view of a sweep: one row per point, the best point, the plots and where everything went."""
from __future__ import annotations

from rich.console import Console, Group

from perflab.report.fit import Column, fitted_tables
from perflab.report.terminal import fmt
from perflab.sweep.point import value_text
from perflab.sweep import SweepPoint, SweepSummary


def sweep_table(summary: SweepSummary, width: int = 200) -> Group:
    """Every point: its swept values, status, quality, throughput, latency, peak memory and MFU; ★ marks the best.

    One column per swept option when they fit in `width`; otherwise the point's label in one column that
    wraps; columns that still do not fit go to a second table under the first, so every number stays whole
    (a number cut to "12,…" reads as nothing)."""
    rows = summary.rows
    params = list(dict.fromkeys(name for row in rows for name in row.params))
    show_mfu = any(row.mfu_pct is not None for row in rows if row.ok)
    index = {"#": [f"{row.index}{' ★' if _is_best(summary, row) else ''}" for row in rows]}
    swept = {name.replace("_size", ""): [value_text(row.params.get(name)) for row in rows] for name in params}
    # status says whether a point finished (ok, oom, error, invalid: NaN/inf); quality is its gate's verdict.
    measured = {"status": [row.status for row in rows], "quality": [row.quality or "—" for row in rows]}
    for header, figure, digits in [("samples/s", "throughput", 1), ("p50 ms", "p50_ms", 2), ("p95 ms", "p95_ms", 2),
                                   ("peak MiB", "peak_memory_mb", 0)] + ([("MFU %", "mfu_pct", 1)] if show_mfu else []):
        measured[header] = [fmt(getattr(row, figure), digits) if row.ok else "" for row in rows]
    one_point_column = _width_needed({**index, **swept, **measured}) > width
    if one_point_column:
        swept = {"point": [row.label for row in rows]}
    columns = [Column("#"), *[Column(header, "left", wraps=True) if one_point_column else Column(header)
                              for header in swept], *[Column(header) for header in measured]]
    cells = [list(row) for row in zip(*index.values(), *swept.values(), *measured.values())]
    key_columns = 2 if one_point_column else 1 + len(swept)
    return fitted_tables(f"sweep · {len(rows)} points · {summary.out}", columns, cells, width,
                         key_columns=key_columns if _width_needed({**index, **swept}) < width // 2 else 1)


def _is_best(summary: SweepSummary, point: SweepPoint) -> bool:
    return summary.best is not None and point.key == summary.best.key


def _width_needed(columns: dict[str, list[str]]) -> int:
    """Terminal columns a table of these cells takes unwrapped: each column's widest cell, padding and border."""
    return 1 + sum(max(len(text) for text in [header, *cells]) + 3 for header, cells in columns.items())


def print_sweep_summary(console: Console, summary: SweepSummary) -> None:
    """The table, the best point (and the best under the latency bound), the plots and the saved files."""
    console.print(sweep_table(summary, console.width))
    if summary.best:
        console.print(f"best throughput: [bold]{summary.best.label}[/] "
                      f"({fmt(summary.best.throughput)} samples/s)", highlight=False)
    if summary.max_p95_ms is not None:
        bounded = summary.best_under_bound
        text = (f"[bold]{bounded.label}[/] ({fmt(bounded.throughput)} samples/s, p95 "
                f"{fmt(bounded.p95_ms, 2)} ms)" if bounded else "[red]no point meets the bound[/]")
        console.print(f"best with p95 ≤ {summary.max_p95_ms:g} ms: {text}", highlight=False)
    memory_kind = next((point.memory_kind for point in summary.rows if point.ok), None)
    if memory_kind:
        console.print(f"[dim]peak MiB: {memory_kind}[/]", highlight=False)
    for path in summary.plots.values():
        console.print(f"plot: {summary.out / path}")
    console.print(f"saved [bold]{summary.out}/sweep.jsonl[/] and sweep.csv; `perflab report {summary.out}` "
                  "writes report.md and report.html")

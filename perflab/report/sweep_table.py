"""The terminal view of a sweep: one row per point, the best point, the plots and where everything went."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perflab.report.terminal import fmt
from perflab.sweep import SweepSummary, value_text


def sweep_table(summary: SweepSummary) -> Table:
    """Every point: its swept values, status, throughput (★ the best), latency, peak memory and MFU."""
    params = list(dict.fromkeys(name for row in summary.rows for name in row["params"]))
    table = Table(title=f"sweep · {len(summary.rows)} points · {summary.out}", title_justify="left")
    for name in ["#"] + params + ["status", "samples/s", "p50 ms", "p95 ms", "peak MiB", "MFU %"]:
        table.add_column(name.replace("_size", ""), justify="right")
    for row in summary.rows:
        mark = " ★" if summary.best and row["key"] == summary.best["key"] else ""
        ok = row["status"] == "ok"
        table.add_row(str(row["index"]), *[value_text(row["params"].get(name)) for name in params], row["status"],
                      (fmt(row["throughput"]) + mark) if ok else "", fmt(row.get("p50_ms"), 2) if ok else "",
                      fmt(row.get("p95_ms"), 2) if ok else "", fmt(row.get("peak_memory_mb"), 0) if ok else "",
                      fmt(row.get("mfu_pct")) if ok else "")
    return table


def print_sweep_summary(console: Console, summary: SweepSummary) -> None:
    """The table, the best point (and the best under the latency bound), the plots and the saved files."""
    console.print(sweep_table(summary))
    if summary.best:
        console.print(f"best throughput: [bold]{summary.best['label']}[/] "
                      f"({fmt(summary.best['throughput'])} samples/s)", highlight=False)
    if summary.max_p95_ms is not None:
        bounded = summary.best_under_bound
        text = (f"[bold]{bounded['label']}[/] ({fmt(bounded['throughput'])} samples/s, p95 "
                f"{fmt(bounded['p95_ms'], 2)} ms)" if bounded else "[red]no point meets the bound[/]")
        console.print(f"best with p95 ≤ {summary.max_p95_ms:g} ms: {text}", highlight=False)
    memory_kind = next((row.get("memory_kind") for row in summary.rows if row["status"] == "ok"), None)
    if memory_kind:
        console.print(f"[dim]peak MiB: {memory_kind}[/]", highlight=False)
    for path in summary.plots.values():
        console.print(f"plot: {summary.out / path}")
    console.print(f"saved [bold]{summary.out}/sweep.jsonl[/] and sweep.csv; `perflab report {summary.out}` "
                  "writes report.md and report.html")

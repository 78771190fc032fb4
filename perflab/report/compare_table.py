"""The terminal view of a comparison: warnings, the performance table, what changed, and the decision."""
from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from perflab.compare import ACCEPT, INCONCLUSIVE, NO_CHANGE, NOT_JUDGED, REJECT, Comparison, MetricChange
from perflab.report.terminal import fmt

DECISION_STYLE = {ACCEPT: "bold green", REJECT: "bold red", NO_CHANGE: "bold yellow", NOT_JUDGED: "bold yellow",
                  INCONCLUSIVE: "bold yellow"}


def _value(value, unit: str) -> str:
    return fmt(value, 2 if unit == "ms/step" else 1)


def _significance(metric: MetricChange, judged: bool = True) -> str:
    if metric.significant and not judged:  # contaminated or unsteady timings: no change is called significant
        return "not judged"
    if metric.significant:
        return "[green]yes, better[/]" if metric.improved else "[red]yes, worse[/]"
    return {False: "no", None: "—"}[metric.significant]


def comparison_table(comparison: Comparison) -> Table:
    """One row per metric: both values, the change, its 95% interval and whether it is significant."""
    table = Table(title=f"performance report · base: {comparison.base.label} · candidate: "
                        f"{comparison.candidate.label}", title_justify="left", caption="CI: " + comparison.method,
                  caption_justify="left")
    # The metric names wrap; the numbers never do (a number broken over two lines misreads).
    table.add_column("metric", ratio=1, min_width=10)
    for column in ("baseline", "candidate", "change"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("95% CI of change", justify="right", min_width=9)
    table.add_column("signif.", justify="right", min_width=6)
    for m in comparison.metrics:
        change = "n/a" if m.change_pct is None else f"{m.change_pct:+.1f}%"
        interval = (m.interval_note or "—") if m.ci_low_pct is None else \
            f"{m.ci_low_pct:+.1f}% … {m.ci_high_pct:+.1f}%"
        table.add_row(f"{m.name} ({m.unit})", _value(m.base, m.unit), _value(m.candidate, m.unit), change,
                      interval, _significance(m, judged=not comparison.noisy or comparison.accept_noisy))
    quality = comparison.quality
    table.add_row("quality gate", quality.base_verdict, quality.verdict, "", "", "")
    return table


def print_comparison(console: Console, comparison: Comparison) -> None:
    """Everything `perflab compare` shows, readable from 80 columns up."""
    for warning in comparison.warnings:
        console.print(Panel(f"[bold]{warning}[/]", title="WARNING", border_style="red"), highlight=False)
    console.print(comparison_table(comparison))
    # Long texts go under the table as lines of their own: squeezed into a column they wrap a word per line.
    quality = comparison.quality
    if quality.reason:
        console.print(f"quality ({quality.verdict}): {quality.reason}", highlight=False)
    for m in comparison.metrics:
        if m.note and (m.base is not None or m.candidate is not None):
            console.print(f"[dim]{m.name}: {m.note}[/]", highlight=False)
    if comparison.config_changes:
        console.print("changed: " + "; ".join(f"{k} {v[0]} → {v[1]}" for k, v in comparison.config_changes.items()),
                      highlight=False)
    phases = [p for p in comparison.phases if abs(p.delta_ms) > 0.0005][:5]
    if phases:
        console.print("phases that account for the difference (ms/step): " + ", ".join(
            f"{p.phase} {p.delta_ms:+.3f}" for p in phases), highlight=False)
    if comparison.kernels:
        console.print("kernels (ms/step): " + ", ".join(f"{k.kernel[:40]} {k.delta_ms:+.3f}"
                                                        for k in comparison.kernels[:5]), highlight=False)
    else:
        console.print(f"[dim]{comparison.kernel_note}[/]")
    for finding in comparison.findings:
        console.print(f"finding ({finding['cls']}): {finding['summary']}", highlight=False)
    style = DECISION_STYLE[comparison.decision]
    body = "\n".join(f"• {reason}" for reason in comparison.reasons)
    console.print(Panel(body, title=f"decision: {comparison.decision.upper()}", border_style=style.split()[-1],
                        title_align="left"), highlight=False)

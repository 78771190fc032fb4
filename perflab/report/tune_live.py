"""The live terminal table of `perflab tune`: one row per finished trial, and the trial running now."""
from __future__ import annotations

import time
from typing import Any, Optional, Union

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from perflab.report.fit import Column, fitted_tables
from perflab.report.terminal import fmt
from perflab.tune.driver import TuneObserver
from perflab.tune.output import objective_figure
from perflab.tune.record import SCREEN
from perflab.tune.rows import TrialRow
from perflab.tune.record import CONFIRM
from perflab.tune.trial import OK


def _typed(row: Union[TrialRow, dict[str, Any]]) -> TrialRow:
    """A row as the table shows it (one handed over as recorded, a dict, is read as tune.jsonl would be)."""
    return row if isinstance(row, TrialRow) else TrialRow.from_dict(row)


def _decision_text(row: TrialRow) -> str:
    decision = row.decision
    if row.kind == "profile":
        return "[dim]profiled[/]" if row.status == OK else f"[red]{row.status}[/]"
    if row.stage == SCREEN:  # one short trial: a win still has to be confirmed in full
        if row.reference:
            return "[dim]screen reference[/]"
        if row.status != OK:
            return f"[red]screen: {escape(row.status)}[/]"
        gain = row.screened_gain_pct
        return "[dim]screened[/]" if gain is None else f"[dim]screened {gain:+.0f}%[/]"
    if decision is None:
        return "[bold]start[/]"
    if decision.kept:
        return "[bold green]confirmed, kept[/]" if row.stage == CONFIRM else "[bold green]kept[/]"
    style = "red" if decision.judged else "yellow"  # not judged is no loss: shown as such
    return f"[{style}]{escape(decision.verdict)}[/]"


def _gain(row: TrialRow) -> str:
    decision = row.decision
    if decision is None or decision.gain_pct is None:
        return ""
    gain, ci = decision.gain_pct, decision.ci95_pct or [None, None]
    if decision.resolution_pct is not None:  # max-qps: the search's resolution, not an interval
        return f"{gain:+.1f}% [dim](res. {decision.resolution_pct:g}%)[/]"
    return f"{gain:+.1f}%" + (f" [dim]({ci[0]:+.0f}…{ci[1]:+.0f})[/]" if ci[0] is not None else "")


class LiveTuneTable(TuneObserver):
    """A rich Live display of the objective's figure (samples/s, or max q/s); reused rows (from --resume) are
    marked as recorded."""

    def __init__(self, console: Console, objective: str = "throughput"):
        self.console = console
        self.figure, unit = objective_figure(objective)
        self.unit = "max " + unit if objective == "max-qps" else unit
        self.rows: list[tuple[TrialRow, bool]] = []
        self.running: Optional[str] = None
        self.began = time.perf_counter()
        self.live = Live(self._render(), console=console, refresh_per_second=2, transient=False)

    def __enter__(self) -> "LiveTuneTable":
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.running = None
        self.live.update(self._render())
        self.live.stop()

    def _render(self) -> Group:
        columns = [Column("trial", "left", wraps=True), Column("lever", "left", wraps=True), Column(self.unit),
                   Column("predicted"), Column("measured (95% CI)"), Column("quality", "left", wraps=True),
                   Column("decision", "left", wraps=True), Column("wall s")]
        rows = []
        for recorded, reused in self.rows:
            row = _typed(recorded)
            predicted = row.predicted_gain_pct
            quality = (row.decision.quality if row.decision is not None else None) or row.quality or ""
            rows.append([row.name + (" [dim](recorded)[/]" if reused else ""), escape(row.label),
                         self._figure(row), "" if predicted is None else f"{predicted:+.0f}%", _gain(row),
                         escape(str(quality)), _decision_text(row), fmt(row.wall_s, 0)])
        status = Text(f"running {self.running} … ({time.perf_counter() - self.began:.0f} s so far)",
                      style="dim") if self.running else Text("")
        return Group(fitted_tables("perflab tune", columns, rows, self.console.width), status)

    def _figure(self, row: TrialRow) -> str:
        if row.kind == "profile" and self.figure != "throughput":
            return ""  # a profile measures the step, not the objective
        return fmt(row.figure(self.figure))

    def trial_started(self, name: str, kind: str) -> None:
        self.running = f"{name} ({kind})"
        self.live.update(self._render())

    def trial_finished(self, row: TrialRow, reused: bool) -> None:
        self.rows.append((row, reused))
        self.running = None
        self.live.update(self._render())

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{escape(text)}[/]")

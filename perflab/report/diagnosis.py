"""The diagnosis for people: rich tables on the terminal, and a Markdown section for report.md."""
from __future__ import annotations

from typing import Any, Optional, Union

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perflab.diagnose.findings import Finding
from perflab.diagnose.runtime_calls import RuntimeApiProfile
from perflab.diagnose.summary import MemcpyRow, TraceProfile
from perflab.diagnose.verdict import Diagnosis
from perflab.report.operators import operators_markdown, top_ops_lines
from perflab.levers import all_levers


def _as_diagnosis(diag: Union[Diagnosis, dict]) -> Diagnosis:
    """A Diagnosis, also from the dict a result.json or diagnosis.json holds."""
    return Diagnosis.from_dict(diag) if isinstance(diag, dict) else diag


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict) and all(str(key).isdigit() for key in value):  # per rank: {"0": 8.9} -> "rank 0: 8.9"
        return ", ".join(f"rank {key}: {_num(figure, digits)}" for key, figure in value.items())
    if isinstance(value, dict):  # counts by source, e.g. {"aten::item": 12.0} -> "12 aten::item"
        return ", ".join(f"{_num(count, 3).rstrip('0').rstrip('.')} {key}" if isinstance(count, (int, float))
                         else f"{key}: {count}" for key, count in value.items())
    return str(value)


def _gain(finding: Union[Diagnosis, Finding], of: str = "the step") -> str:
    """'explains 40% of the step' (the gain to expect if the cause were removed), or nothing if unknown. A serve
    diagnosis (no trace) explains a share of the p99 tail latency instead."""
    pct = finding.expected_gain_pct
    return "" if pct is None else f"explains {pct:.0f}% of {of}"


def _whole(profile: Optional[TraceProfile]) -> str:
    return "the step" if profile else "the p99 tail"


def _lever_flags() -> dict[str, str]:
    try:
        return {lever.name: lever.flag for lever in all_levers()}
    except Exception:  # the report still prints if a lever module fails to import
        return {}


def _breakdown(profile: TraceProfile) -> list[tuple[str, Optional[float]]]:
    """(label, % of the window) rows: busy, then the idle split (GPU), or host phases (CPU)."""
    gpu = profile.gpu
    if gpu:
        rows = [("GPU busy (kernels)", gpu.busy_pct), ("copies only", gpu.copy_only_pct)]
        rows += [(f"idle: {cause}", pct) for cause, pct in gpu.idle_split_pct.items()]
        return rows
    return [(f"host phase: {name}", pct) for name, pct in profile.host.phase_share_pct.items()]


def print_diagnosis(console: Console, diag: Union[Diagnosis, dict]) -> None:
    """The verdict, its evidence and levers, the time breakdown and the top kernels/ops."""
    d = _as_diagnosis(diag)
    profile = d.profile
    flags = _lever_flags()
    gain = _gain(d, _whole(profile))
    console.print(f"[bold]diagnosis:[/] [bold magenta]{d.bottleneck}[/] (confidence {d.confidence:.2f}"
                  f"{', ' + gain if gain else ''}) — {escape(d.headline)}", highlight=False)
    title = (f"{profile.device} trace · {profile.steps} steps · {profile.step_ms:.2f} ms per step"
             if profile else "from the result's metrics (no trace)")
    verdict = Table(show_header=False, title=title, title_justify="left")
    verdict.add_column("what", style="bold")
    verdict.add_column("value", overflow="fold")  # advice names long identifiers: wrap them, never cut
    for key, value in d.evidence.items():
        verdict.add_row(key, escape(_num(value)))
    for rank, lever in enumerate(d.levers, 1):
        verdict.add_row(f"lever {rank}", escape(f"{lever}  ({flags.get(lever, 'see perflab levers')})"))
    for advice in d.advice:
        verdict.add_row("also", escape(advice))
    if d.tried_and_lost:
        verdict.add_row("tried and lost", escape(", ".join(d.tried_and_lost)))
    console.print(verdict)
    if not profile:  # a diagnosis from a result alone (perflab serve): no trace breakdown to show
        return
    breakdown = Table(title="where the time goes (share of the profiled steps)", title_justify="left")
    breakdown.add_column("part")
    breakdown.add_column("share", justify="right")
    for label, pct in _breakdown(profile):
        breakdown.add_row(label, f"{_num(pct)}%")
    console.print(breakdown)
    for line in top_ops_lines(d.operators):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(_top_table(profile))
    gpu = profile.gpu
    if gpu and gpu.memcpy_table:
        console.print(_memcpy_table(gpu.memcpy_table))
    if profile.runtime_api and profile.runtime_api.kinds:
        console.print(_runtime_api_table(profile.runtime_api))
    for finding in _others(d):
        gain = _gain(finding, _whole(profile))
        console.print(f"[dim]also considered: {finding.cls} ({finding.confidence:.2f}"
                      f"{', ' + gain if gain else ''}): {escape(finding.summary)}[/]")


def _top_table(profile: TraceProfile) -> Table:
    gpu = profile.gpu
    if gpu:
        table = Table(title=f"top kernels ({gpu.kernels_per_step:.0f} per step, "
                      f"{gpu.short_kernel_count_pct:.0f}% shorter than 10 µs)", title_justify="left")
        for column in ("kernel", "kind", "per step", "ms/step", "mean µs", "share"):
            table.add_column(column, justify="left" if column in ("kernel", "kind") else "right")
        for row in gpu.kernel_table:
            table.add_row(escape(row.name[:70]), row.kind, _num(row.count_per_step), _num(row.ms_per_step, 3),
                          _num(row.mean_us), f"{_num(row.share_pct)}%")
        return table
    host = profile.host
    table = Table(title=f"top CPU ops by self time ({host.ops_per_step:.0f} ops per step)", title_justify="left")
    for column in ("op", "calls/step", "self ms/step", "mean µs", "share"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for row in host.op_table:
        table.add_row(escape(row.name[:70]), _num(row.calls_per_step), _num(row.self_ms_per_step, 3),
                      _num(row.mean_self_us), f"{_num(row.share_pct)}%")
    return table


def _memcpy_table(rows: list[MemcpyRow]) -> Table:
    table = Table(title="memory copies", title_justify="left")
    for column in ("kind", "per step", "ms/step", "MB/step", "GB/s", "overlap with compute"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for row in rows:
        table.add_row(row.kind, _num(row.count_per_step), _num(row.ms_per_step, 3), _num(row.mb_per_step),
                      _num(row.gbps), f"{_num(row.overlap_with_compute_pct)}%")
    return table


def _others(d: Diagnosis) -> list[Finding]:
    """Every finding but the verdict's (another finding of the same class is still shown)."""
    return [f for f in d.findings if not (f.cls == d.bottleneck and f.summary == d.headline)]


def _runtime_api_rows(api: RuntimeApiProfile) -> list[tuple[str, str, str, str, str]]:
    """(kind, calls/step, ms/step, GPU idle after them, top caller) per kind of runtime call."""
    rows = []
    for kind, calls in api.kinds.items():
        caller = next(iter(calls.by_caller_per_step), "")
        rows.append((kind, _num(calls.calls_per_step), _num(calls.ms_per_step, 3),
                     f"{_num(calls.gpu_idle_pct)}%", caller if len(caller) <= 40 else "…" + caller[-39:]))
    return rows


def _runtime_api_table(api: RuntimeApiProfile) -> Table:
    table = Table(title="CUDA runtime API per step (blocking calls, allocator)", title_justify="left")
    for column in ("kind", "calls", "ms", "GPU idle", "top caller"):
        table.add_column(column, justify="right" if column in ("calls", "ms", "GPU idle") else "left",
                         overflow="fold")
    for row in _runtime_api_rows(api):
        table.add_row(*(escape(cell) for cell in row))
    return table


def diagnosis_markdown(diag: Union[Diagnosis, dict]) -> str:
    """The diagnosis as a Markdown section (## Diagnosis) for the run's report.md."""
    d = _as_diagnosis(diag)
    profile = d.profile
    flags = _lever_flags()
    gain = _gain(d, _whole(profile))
    lines = ["## Diagnosis", "",
             f"**{d.bottleneck}** (confidence {d.confidence:.2f}{', ' + gain if gain else ''}): {d.headline}", "",
             f"{profile.device} trace, {profile.steps} profiled steps, {profile.step_ms:.2f} ms per step."
             if profile else "From the result's metrics (no trace).", ""]
    if d.evidence:
        lines += ["| evidence | value |", "|---|---|"]
        lines += [f"| {key} | {_num(value)} |" for key, value in d.evidence.items()]
        lines.append("")
    if d.levers:
        lines.append("Levers to try, best first:")
        lines += [f"{rank}. `{lever}` ({flags.get(lever, 'see perflab levers')})"
                  for rank, lever in enumerate(d.levers, 1)]
        lines.append("")
    lines += [f"- {advice}" for advice in d.advice]
    if d.advice:
        lines.append("")
    if d.tried_and_lost:
        lines += [f"Tried on this run and lost (not proposed again): {', '.join(d.tried_and_lost)}.", ""]
    if not profile:
        return "\n".join(lines)
    lines += ["| where the time goes | share |", "|---|---|"]
    lines += [f"| {label} | {_num(pct)}% |" for label, pct in _breakdown(profile)]
    lines.append("")
    gpu = profile.gpu
    if gpu and gpu.kernel_table:
        lines += ["| top kernel | kind | per step | ms/step | mean µs | share |", "|---|---|---|---|---|---|"]
        lines += [f"| `{row.name[:60]}` | {row.kind} | {_num(row.count_per_step)} | "
                  f"{_num(row.ms_per_step, 3)} | {_num(row.mean_us)} | {_num(row.share_pct)}% |"
                  for row in gpu.kernel_table[:5]]
        lines.append("")
    api = profile.runtime_api
    if api and api.kinds:
        lines += ["| CUDA runtime API | calls/step | ms/step | GPU idle | top caller |", "|---|---|---|---|---|"]
        lines += [f"| {kind} | {calls} | {ms} | {idle} | `{caller}` |"
                  for kind, calls, ms, idle, caller in _runtime_api_rows(api)]
        lines.append("")
    operators = operators_markdown(d.operators)
    if operators:
        lines += [operators, ""]
    others = _others(d)
    if others:
        lines.append("Also considered: " + "; ".join(
            f"{f.cls} ({f.confidence:.2f}{', ' + _gain(f) if _gain(f) else ''})" for f in others) + ".")
        lines.append("")
    return "\n".join(lines)

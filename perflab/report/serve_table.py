"""The terminal view of a serve result: one row per point, the max QPS, the harness's own capacity."""
from __future__ import annotations

import math
from typing import Optional

from rich.console import Console, Group
from rich.markup import escape

from perflab.diagnose.verdict import Diagnosis
from perflab.environment import describe_device
from perflab.report.fit import Column, fitted_tables
from perflab.report.terminal import fmt
from perflab.results import Result
from perflab.results.metrics import Capacity, LoadPoint, PointValidity
from perflab.serve.metrics import COMPONENTS


def verdict_word(point: LoadPoint) -> str:
    """VALID or INVALID, as LoadGen's summary says it (a result from before validity: pass / fail)."""
    if point.validity is None:
        return "pass" if point.passed else "fail"
    if point.loadgen:  # MLCommons LoadGen issued the queries: its verdict decides
        return f"{point.loadgen['validity']} (LoadGen)"
    return "VALID" if point.validity.valid else "INVALID"


def _verdict(point: LoadPoint) -> str:
    word = verdict_word(point)
    return f"[green]{word}[/]" if word.startswith(("VALID", "pass")) else f"[red]{word}[/]"


def validity_lines(points: list[LoadPoint]) -> list[str]:
    """One line per INVALID point with its reasons, and one per warning flag (plain text)."""
    lines = []
    for point in points:
        validity = point.validity or PointValidity()
        judged = point.loadgen
        if judged:
            lines.append(f"point {point.index} LoadGen {judged['validity']}: p99 {judged.get('p99_ms', math.nan):.2f} "
                         f"ms, early stopping {'met' if judged.get('early_stopping_met') else 'not met'}; perflab on "
                         f"the same queries: {'VALID' if validity.valid else 'INVALID'}")
        if validity.reasons:
            lines.append(f"point {point.index} {'perflab: ' if judged else ''}INVALID: "
                         f"{'; '.join(validity.reasons)}"
                         + (f" (too short, not too slow: rerun longer as point {point.rerun_as})"
                            if point.rerun_as is not None else ""))
        lines += [f"point {point.index} flag: {flag}" for flag in validity.flags or []]
    return lines


def point_row(point: LoadPoint) -> list[str]:
    """The cells of one point (also printed as each point finishes)."""
    lat = point.latency_ms
    return [str(point.index), fmt(point.offered_qps, 0), fmt(point.realised_offered_qps, 0),
            fmt(point.achieved_qps, 0), fmt(lat["p50"], 2),
            fmt(lat["p90"], 2), fmt(lat["p99"], 2), fmt(lat["p99.9"], 2),
            f"{fmt(point.batch_mean)} ({fmt(point.batch_fill_pct, 0)}%)",
            fmt(gpu_util_pct(point), 0), fmt(point.cost_per_million_queries, 3),
            _verdict(point)]


def gpu_util_pct(point: LoadPoint) -> Optional[float]:
    """The point's mean GPU utilisation (None: NVML did not sample)."""
    return (point.gpu or {}).get("util_mean_pct")


def dispatch_delay_p99_ms(point: LoadPoint) -> Optional[float]:
    """How late the batcher dispatched the point's batches at p99 (None: a result from before it was measured)."""
    return point.dispatch_delay_ms.p99_ms if point.dispatch_delay_ms else None


POINT_COLUMNS = ("#", "offered q/s", "realised q/s", "achieved q/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "batch (fill)",
                 "GPU %", "cost/1M", "verdict")


def serve_table(result: Result, width: int = 200) -> Group:
    serve, cfg = result.metrics.serve, result.config
    settings = serve.settings
    levers = ", ".join(result.levers) or "none"
    title = (f"perflab serve · {cfg.workload} · {serve.scenario} · max batch {settings.max_batch} "
             f"· timeout {settings.batch_timeout_ms:g} ms · {settings.instances} instance(s) · "
             f"{cfg.precision} · levers: {levers} · {describe_device(result.environment, cfg.device)}"
             f" · verdict: p99 ≤ {settings.p99_ms:g} ms")
    columns = [Column(name, "left" if name == "verdict" else "right") for name in POINT_COLUMNS]
    return fitted_tables(title, columns, [point_row(point) for point in serve.points], width)


def tail_table(result: Result, width: int = 200) -> Group:
    """Where the time of the slowest 1% of queries goes, per point (mean ms of each part)."""
    headers = ("#",) + tuple(part.replace("_", " ") for part in COMPONENTS) + ("dispatch delay p99 (batches)",)
    rows = [[str(point.index), *[fmt(point.time_ms["tail"].get(part), 2) for part in COMPONENTS],
             fmt(dispatch_delay_p99_ms(point), 2)] for point in result.metrics.serve.points]
    return fitted_tables("where the p99 tail goes (mean ms per query at or past p99)",
                         [Column(name) for name in headers], rows, width)


def generation_table(result: Result, width: int = 200) -> Group:
    """Per point of a generation workload: TTFT (from the scheduled arrival), TPOT, ITL, tokens/s, goodput."""
    headers = ("#", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "ITL p99 ms", "output tok/s",
               "requests/s", "goodput req/s (SLO met)")
    rows = []
    for point in result.metrics.serve.points:
        gen = point.generation
        if not gen:
            continue
        ttft, tpot, itl = (gen.get(key) or {} for key in ("ttft_ms", "tpot_ms", "itl_ms"))
        goodput = gen.get("goodput")
        rows.append([str(point.index), fmt(ttft.get("p50"), 2), fmt(ttft.get("p99"), 2), fmt(tpot.get("p50"), 2),
                     fmt(tpot.get("p99"), 2), fmt(itl.get("p99"), 2), fmt(gen["output_tokens_per_s"], 0),
                     fmt(gen["requests_per_s"], 1),
                     f"{fmt(goodput['goodput_requests_per_s'], 1)} ({fmt(goodput['requests_meeting_slo_pct'], 0)}%)"
                     if goodput else "no --slo"])
    return fitted_tables("generation per point (TTFT from each request's scheduled arrival: queue wait included)",
                         [Column(name) for name in headers], rows, width)


def capacity_text(capacity: Capacity) -> str:
    """The harness's capacity in one line (the table and the markdown report share it)."""
    moves = (f"the batcher moves {fmt(capacity.batcher_qps_at_max_batch, 0)} queries/s at max batch and "
             f"{fmt(capacity.batcher_batches_per_s, 0)} batches/s at batch 1")
    if capacity.dispatch_delay_p99_ms is None:  # a result from before arrivals were virtual
        return f"{moves}; the load generator issued {fmt(capacity.loadgen_issue_qps, 0)} queries/s"
    return (f"{moves}; on a Poisson schedule at {fmt(capacity.dispatch_probe_qps, 0)} queries/s it dispatches "
            f"batches {fmt(capacity.dispatch_delay_p99_ms, 3)} ms late at p99 (arrivals are virtual: read off "
            "the schedule, no thread issues them)")


def print_serve(console: Console, result: Result) -> None:
    """The points table, the max QPS, the capacity of the harness, the diagnosis headline and notes."""
    serve = result.metrics.serve
    console.print(serve_table(result, console.width))
    console.print(tail_table(result, console.width))
    if any(point.generation for point in serve.points):
        console.print(generation_table(result, console.width))
    if serve.search:
        found = serve.max_qps
        console.print(f"max QPS with p99 ≤ {serve.settings.p99_ms:g} ms: "
                      + (f"[bold]{fmt(found, 1)}[/] queries/s" if found else "[red]none: even the lowest rate failed[/]")
                      + f" ({len(serve.search.tried)} points, bracket to "
                      f"{fmt(serve.search.lowest_failing_qps, 1)})", highlight=False)
    offline = [p for p in serve.points if p.scenario == "offline"]
    if offline:
        console.print(f"offline: [bold]{fmt(offline[0].achieved_qps, 1)}[/] samples/s", highlight=False)
    capacity = serve.capacity
    if capacity:
        console.print(f"harness capacity (no-op model): {capacity_text(capacity)}", highlight=False)
    for line in validity_lines(serve.points):
        console.print(f"[yellow]{escape(line)}[/]", highlight=False)
    if result.diagnosis:
        diagnosis = Diagnosis.from_dict(result.diagnosis)
        console.print(f"[bold]diagnosis:[/] [bold magenta]{diagnosis.bottleneck}[/] — {diagnosis.headline}",
                      highlight=False)
        for advice in diagnosis.advice:
            console.print(f"  · {advice}", highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    if result.path:
        console.print(f"saved [bold]{result.path}[/]; `perflab report {result.path.rsplit('/', 1)[0]}` plots it")

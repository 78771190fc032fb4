"""The max-qps objective: a trial is `perflab serve --find-max-qps --p99-ms X`, judged by its max QPS.

A serve trial's max QPS is known only to the search's own resolution: the bisection stops when the bracket around
the peak is narrower than --search-tolerance-pct of it. A candidate is kept when its max QPS beats the best's by
more than that resolution and by more than --min-effect-pct, and its quality gate (serve runs it for levers that
change numerics; tune turns it on for every candidate) did not fail.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from perflab import options
from perflab.compare import INCONCLUSIVE
from perflab.config import RunConfig
from perflab.results.metrics import Serve
from perflab.results import Result
from perflab.results.quality import verdict_of
from perflab.serve.config import ServeConfig
from perflab.tune.decision import Decision

SERVE = "serve"  # the trial kind (and the perflab command) of a max-qps measurement


def serve_record(result: Result) -> Serve:
    return result.metrics.serve or Serve()


def max_qps_of(result: Result) -> Optional[float]:
    """The highest rate whose p99 met the bound (None: no rate did)."""
    return serve_record(result).max_qps


def resolution_pct(result: Result, serve_cfg: Optional[ServeConfig] = None) -> float:
    """The search's resolution in percent: its bisection tolerance as recorded (or as configured)."""
    search = serve_record(result).search
    tolerance = search.tolerance if search is not None else None
    if tolerance is not None:
        return 100 * tolerance
    return (serve_cfg or ServeConfig()).search_tolerance_pct


def serve_figures(result: Result) -> dict[str, Any]:
    """What tune.jsonl records of a serve trial: the max QPS, the p99, batch fill and the batcher's dispatch delay
    there, the resolution, and how many points the harness dispatched late (not valid: they never pass)."""
    record = serve_record(result)
    peak = record.max_qps
    at_peak = next((point for point in reversed(record.points)
                    if point.passed and point.offered_qps == peak), None)
    delay = at_peak.dispatch_delay_ms if at_peak else None
    return {"max_qps": peak, "resolution_pct": resolution_pct(result),
            "p99_ms": at_peak.p99_ms if at_peak else None, "achieved_qps": at_peak.achieved_qps if at_peak else None,
            "batch_fill_pct": at_peak.batch_fill_pct if at_peak else None, "single_query_ms": record.single_query_ms,
            "dispatch_delay_p99_ms": delay.p99_ms if delay else None,
            "harness_late_points": sum(bool(point.harness_late) for point in record.points),
            "search_skipped": record.search.skipped if record.search is not None else None,
            "quality": verdict_of(result.quality, None)}


def judge_max_qps(best: Result, candidate: Result, min_effect_pct: float) -> Decision:
    """Keep a candidate whose max QPS beats the best's by more than the search's resolution and --min-effect-pct,
    unless its quality gate failed."""
    before, after = max_qps_of(best), max_qps_of(candidate)
    resolution = resolution_pct(candidate)
    quality = verdict_of(candidate.quality)
    gain = None if not before or after is None else 100 * (after / before - 1)
    figures = dict(gain_pct=gain, quality=quality, objective="max-qps", against_value=before, value=after,
                   resolution_pct=resolution)
    if quality == "fail":
        why = f"the candidate failed the quality gate: {candidate.quality.reason or 'no reason recorded'}"
        return Decision(False, "reject", why, reasons=[why], **figures)
    if after is None:
        search = serve_record(candidate).search
        skipped = search.skipped if search is not None else None
        why = f"no rate met the p99 bound{': ' + skipped if skipped else ''}"
        return Decision(False, "reject", why, reasons=[why], **figures)
    threshold = max(resolution, min_effect_pct)
    change = f"max QPS {before:,.0f} → {after:,.0f} q/s ({gain:+.1f}%)"
    if gain > threshold and quality == INCONCLUSIVE:
        why = f"the quality gate was inconclusive: {candidate.quality.reason}"
        return Decision(False, INCONCLUSIVE, why, reasons=[why, change], judged=False, **figures)
    if gain > threshold:
        why = (f"{change}: more than the search's resolution ({resolution:g}%) and --min-effect-pct "
               f"({min_effect_pct:g}%)")
        return Decision(True, "accept", why, reasons=[why], **figures)
    if gain < -threshold:
        why = f"{change}: lower by more than the search's resolution ({resolution:g}%)"
        return Decision(False, "reject", why, reasons=[why], **figures)
    why = (f"{change}: inside the search's resolution ({resolution:g}%) or under --min-effect-pct "
           f"({min_effect_pct:g}%)")
    return Decision(False, "no significant change", why, reasons=[why], **figures)


def serve_refusal(option_name: str) -> Optional[str]:
    """Why a lever's option cannot be part of a serve trial (the option table says which commands take it)."""
    declared = options.option_named(RunConfig, option_name)
    if SERVE in declared.commands:
        return None
    return (f"{declared.flag} is not an option of perflab serve (its queries come from a staged sample pool through "
            "the dynamic batcher); the max-qps objective cannot measure it")


def unserved_options(cfg: RunConfig, given: Iterable[str] = ()) -> list[options.Option]:
    """The run options set in `cfg` (or `given` by name on the command line, even at their defaults) that a serve
    trial cannot carry: perflab serve does not take them (the option table's `commands`)."""
    return [declared for declared in options.options_of(RunConfig) if SERVE not in declared.commands
            and (declared.name in given or options.is_set(declared, getattr(cfg, declared.name)))]


def serve_argv(cfg: RunConfig, serve_cfg: ServeConfig) -> list[str]:
    """`perflab serve` options of a run config and the serve settings, always naming the workload."""
    argv = cfg.to_argv(SERVE)
    if "--workload" not in argv:
        argv = ["--workload", cfg.workload, *argv]
    return [*argv, *serve_cfg.to_argv()]

"""What compare refuses to judge: a run whose figures are NaN/inf (a diverged or corrupt run never passes), or
negative (a throughput or a latency below zero was edited or corrupted, not measured)."""
from __future__ import annotations

import math

from perflab.errors import PerflabError
from perflab.results import Result


def non_finite_figures(result: Result) -> list[str]:
    """The figures of a result that are NaN/inf (throughput, per-trial throughput, latency, loss): each named."""
    found = []
    figures = {"throughput": result.throughput, "p50 latency": result.metrics.latency_ms.p50,
               "p95 latency": result.metrics.latency_ms.p95}
    figures.update({f"trial {number} throughput": trial.throughput_samples_per_s
                    for number, trial in enumerate(result.trials, 1)})
    gate = result.quality.metrics if result.quality is not None else None
    figures.update({f"quality {name}": getattr(gate, name, None)
                    for name in ("final_loss_candidate", "final_loss_baseline")})
    for name, value in figures.items():
        if isinstance(value, (int, float)) and not math.isfinite(value):
            found.append(f"{name} is {value}")
    if any(not math.isfinite(ms) for trial in result.trials for ms in trial.step_ms):
        found.append("some step times are NaN/inf")
    return found


def negative_figures(result: Result) -> list[str]:
    """The fields of a result holding a throughput or latency below zero, each named as in result.json."""
    latency = result.metrics.latency_ms
    figures = {"metrics.throughput_samples_per_s.median": result.throughput, "metrics.latency_ms.p50": latency.p50,
               "metrics.latency_ms.p95": latency.p95}
    figures.update({f"trials[{index}].throughput_samples_per_s": trial.throughput_samples_per_s
                    for index, trial in enumerate(result.trials)})
    found = [f"field {name} is {value:g}" for name, value in figures.items()
             if isinstance(value, (int, float)) and value < 0]
    for index, trial in enumerate(result.trials):
        below = [ms for ms in trial.step_ms or [] if isinstance(ms, (int, float)) and ms < 0]
        if below:
            found.append(f"field trials[{index}].step_ms holds {below[0]:g}")
    return found


def refuse_non_finite(base: Result, cand: Result) -> None:
    """Refuse (one line) to judge runs with negative or NaN/inf figures: say which side, file and figures."""
    for side, result in (("base", base), ("candidate", cand)):
        negative = negative_figures(result)
        if negative:
            raise PerflabError(f"cannot judge: the {side} {result.path or 'run'}: {negative[0]}, and a throughput or "
                               "latency cannot be negative; fix that field or re-run it")
    for side, result in (("base", base), ("candidate", cand)):
        bad = non_finite_figures(result)
        if bad:
            where = f" ({result.path})" if result.path else ""
            raise PerflabError(f"cannot judge: the {side}{where} holds NaN/inf figures ({'; '.join(bad[:3])}): a "
                               "diverged or corrupt run is never compared; re-run it")

"""Compare a baseline run with a candidate: the performance report and an accept/reject decision.

Statistics: each change comes with a 95% percentile-bootstrap confidence interval of the ratio
candidate/base of a statistic, resampling each side independently (perflab.stats.bootstrap_ratio_ci, seeded, so reports are reproducible):
throughput resamples the per-trial throughputs (statistic: median), latency resamples the per-step
latencies pooled over trials (statistic: p50 or p95). A change is significant when its interval excludes
zero. The decision:

1. the candidate failed its quality gate -> reject, whatever the speed;
2. either run's timings are contaminated (a busy machine, an unfinished run, a run whose own trials disagree: "not
   steady") -> not judged (unless --accept-noisy);
3. throughput significantly lower by more than the minimum effect -> reject (a regression);
4. throughput significantly higher by more than the minimum effect -> accept, unless the quality gate was
   inconclusive -> inconclusive;
5. fewer than 2 trials on a side (no interval) -> inconclusive;
6. anything else -> no significant change (a speed-up inside the noise is not a win).

A run whose throughput or latency is NaN/inf is refused: no decision can rest on it.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from perflab.config import MIN_EFFECT_PCT, RunConfig, numerics_fields, saved_config
from perflab.cost import cost_per_million
from perflab.errors import PerflabError
from perflab.harness.interference import busy_reasons
from perflab.stats import NO_INTERVAL, RATIO_BOOTSTRAP_RESAMPLES, bootstrap_ratio_ci
from perflab.results.metrics import Flops, Gpu
from perflab.results import Result, read_json_object, resolve_result_path, validate, write_json_atomic
from perflab.results.quality import QualityVerdict, verdict_of
from perflab.compare.kernels import KernelChange, kernel_changes
from perflab.compare.refusals import refuse_non_finite
from perflab.diagnose.generation_loop import loop_overhead_between

COMPARE_FILE = "compare.json"
CONFIDENCE = 0.95
RESAMPLES = RATIO_BOOTSTRAP_RESAMPLES
METHOD = (f"{int(CONFIDENCE * 100)}% percentile-bootstrap confidence interval ({RESAMPLES} resamples, seeded) "
          "of the candidate/base ratio: throughput from per-trial values (median), latency from per-step "
          "values pooled over trials (p50, p95); significant when the interval excludes no change")
ACCEPT, REJECT, NO_CHANGE = "accept", "reject", "no significant change"
NOT_JUDGED = "not judged"  # contaminated timings: the speed was not judged
INCONCLUSIVE = "inconclusive"  # the evidence cannot support a decision (no interval, an inconclusive quality gate)
DECISIONS = (ACCEPT, REJECT, NO_CHANGE, NOT_JUDGED, INCONCLUSIVE)
# Config fields that say where or how a run was stored, not what was measured.
IGNORED_CONFIG = {"out", "resume_from", "checkpoint_every", "nsys"}
# The metrics a comparison keeps of each side, so compare.json stands alone when the runs move.
MAX_RESAMPLED_STEPS = 20_000  # per side: more per-step values are summarised by their quantiles (capped_steps)
SUMMARY_METRICS = ("throughput_samples_per_s", "latency_ms", "phases_ms", "memory", "gpu", "flops",
                   "cost_per_million_samples")


@dataclass
class MetricChange:
    """One row of the report: both values, the change, and its confidence interval when trials allow one."""

    name: str
    unit: str
    better: str  # "higher" or "lower"
    base: Optional[float]
    candidate: Optional[float]
    change_pct: Optional[float] = None
    ci_low_pct: Optional[float] = None
    ci_high_pct: Optional[float] = None
    significant: Optional[bool] = None  # None: no interval (a single value per side)
    note: str = ""
    interval_note: str = ""  # why there is no interval, when the values allowed none (report/interval.py)

    @property
    def improved(self) -> bool:
        return bool(self.significant) and ((self.change_pct or 0) > 0) == (self.better == "higher")


@dataclass
class ComparedRun:
    """One side of a comparison: what a report needs of its run, so compare.json stands alone when the runs move."""

    path: Optional[str] = None
    label: str = ""
    config: RunConfig = field(default_factory=RunConfig)
    environment: dict[str, Any] = field(default_factory=dict)
    levers: list[str] = field(default_factory=list)
    quality: Any = None  # the run's quality verdict (None: no gate ran)
    metrics: dict[str, Any] = field(default_factory=dict)  # SUMMARY_METRICS of the run's metrics, as saved
    step_ms: list[float] = field(default_factory=list)
    created_utc: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config": self.config.to_dict()}  # a script's config saves its own fields only

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ComparedRun":
        values = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        return cls(**{**values, "config": saved_config(data.get("config") or {})})


@dataclass
class PhaseChange:
    """Mean ms per step of one phase, base vs candidate."""

    phase: str
    base_ms: float
    candidate_ms: float
    delta_ms: float
    share_of_change_pct: Optional[float] = None  # of the change in mean step time


@dataclass
class ComparedQuality:
    """The candidate's quality verdict beside the baseline's."""

    verdict: str = "not checked"
    reason: str = ""
    numbers: dict[str, float] = field(default_factory=dict)  # the candidate's quality figures
    base_verdict: str = "not checked"


@dataclass
class Comparison:
    base: ComparedRun
    candidate: ComparedRun
    metrics: list[MetricChange]
    decision: str  # accept | reject | no significant change
    reasons: list[str]
    warnings: list[str]
    config_changes: dict[str, list[Any]]
    phases: list[PhaseChange]
    kernels: Optional[list[KernelChange]]
    kernel_note: str
    quality: ComparedQuality
    method: str = METHOD
    min_effect_pct: float = MIN_EFFECT_PCT
    kind: str = "compare"
    noisy: list[str] = field(default_factory=list)  # why the timings are not clean (busy machine, ...)
    accept_noisy: bool = False
    noisy_sides: list[str] = field(default_factory=list)  # whose timings `noisy` is about: "base", "candidate"
    # what the difference itself shows, as diagnosis findings (a generation loop's own work per token: a run of the
    # model's step beside a run of the workload's own loop, diagnose/generation_loop.py)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def metric(self, name: str) -> MetricChange:
        return next(m for m in self.metrics if m.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "base": self.base.to_dict(), "candidate": self.candidate.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Comparison":
        data = dict(data)
        data["metrics"] = [MetricChange(**m) for m in data["metrics"]]
        data["base"], data["candidate"] = ComparedRun.from_dict(data["base"]), ComparedRun.from_dict(data["candidate"])
        data["phases"] = [PhaseChange(**row) for row in data["phases"]]
        if data.get("kernels"):  # None (or absent): the kernels were not compared, and kernel_note says why
            data["kernels"] = [KernelChange(**row) for row in data["kernels"]]
        data["quality"] = ComparedQuality(**data["quality"])
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def save(self, directory: Union[str, Path]) -> Path:
        path = Path(directory) / COMPARE_FILE
        write_json_atomic(path, self.to_dict())
        return path


def load_comparison(path: Union[str, Path]) -> Comparison:
    path = Path(path)
    path = path / COMPARE_FILE if path.is_dir() else path
    data = read_json_object(path, "a perflab comparison", "re-run perflab compare")
    for index, row in enumerate(validate.objects(data, "metrics", path)):
        validate.numbers(row, ("base", "candidate", "change_pct", "ci_low_pct", "ci_high_pct"), path,
                         prefix=f"metrics[{index}].")
    validate.number(data, "min_effect_pct", path)
    try:
        return Comparison.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PerflabError(f"{path} is not a perflab comparison ({type(err).__name__}); re-run perflab compare") from None


def load_result(path: Union[str, Path]) -> Result:
    """Result.load, with a one-line error for files that parse but do not hold a usable result."""
    result = Result.load(path)
    if result.metrics.serve is not None:
        raise PerflabError(f"{resolve_result_path(path)} is a `perflab serve` result; compare and rerun take `perflab "
                           f"run` results (repeat it with: {' '.join(result.command) or 'perflab serve ...'})")
    try:
        trials = result.trials
        if not trials or not all(trial.step_ms is not None for trial in trials):
            raise ValueError("no trials")
        if result.metrics.throughput is None or result.metrics.latency_ms.p50 is None:
            raise ValueError("no metrics")
    except (TypeError, ValueError, AttributeError):
        raise PerflabError(f"{resolve_result_path(path)} is not a complete perflab result (missing trials or "
                           "metrics); re-run it") from None
    return result


def _p95(values: np.ndarray, axis: int) -> np.ndarray:
    return np.percentile(values, 95, axis=axis)


def _p50(values: np.ndarray, axis: int) -> np.ndarray:
    return np.median(values, axis=axis)


def _change(name: str, unit: str, better: str, base: Optional[float], cand: Optional[float],
            samples: Optional[tuple[list[float], list[float], Callable]] = None, note: str = "") -> MetricChange:
    row = MetricChange(name, unit, better, base, cand, note=note)
    if base is None or cand is None or not base:
        return row
    row.change_pct = 100 * (cand / base - 1)
    if samples is None:
        return row
    base_values, cand_values, statistic = (np.asarray(samples[0], float), np.asarray(samples[1], float), samples[2])
    if base_values.size < 2 or cand_values.size < 2:
        row.interval_note = NO_INTERVAL
        row.note = (note + "; " if note else "") + "one value on a side: no interval (use --trials 3 or more)"
        return row
    low, high = bootstrap_ratio_ci(base_values, cand_values, statistic, CONFIDENCE)
    row.ci_low_pct, row.ci_high_pct = 100 * (low - 1), 100 * (high - 1)
    row.significant = low > 1 or high < 1
    return row


def capped_steps(result: Result) -> tuple[np.ndarray, Optional[str]]:
    """The per-step latencies pooled over trials, at most MAX_RESAMPLED_STEPS of them: past that, evenly spaced
    quantiles of the sorted values (the same p50/p95 to within a step), with a note saying so. Resampling millions
    of steps RESAMPLES times would not fit in memory and would not narrow the interval anyway."""
    steps = np.concatenate([np.asarray(trial.step_ms, float) for trial in result.trials]) if result.trials \
        else np.zeros(0)
    if steps.size <= MAX_RESAMPLED_STEPS:
        return steps, None
    kept = np.quantile(steps, np.linspace(0, 1, MAX_RESAMPLED_STEPS))
    return kept, (f"{steps.size} per-step values in {result.path or 'a run'}: the latency intervals resample "
                  f"{MAX_RESAMPLED_STEPS} evenly spaced quantiles of them")


def metric_changes(base: Result, cand: Result) -> list[MetricChange]:
    """Throughput, p50/p95 latency, GPU utilisation, peak memory and MFU, base vs candidate."""
    (base_steps, base_note), (cand_steps, cand_note) = capped_steps(base), capped_steps(cand)
    step_note = "; ".join(note for note in (base_note, cand_note) if note)
    base_memory, cand_memory = base.peak_memory, cand.peak_memory
    gpu_base, gpu_cand = base.metrics.gpu or Gpu(), cand.metrics.gpu or Gpu()
    return [
        _change("throughput", "samples/s", "higher", base.throughput, cand.throughput,
                ([t.throughput_samples_per_s for t in base.trials], [t.throughput_samples_per_s for t in cand.trials],
                 np.median)),
        _change("p50 latency", "ms/step", "lower", base.metrics.latency_ms.p50, cand.metrics.latency_ms.p50,
                (base_steps, cand_steps, _p50), note=step_note),
        _change("p95 latency", "ms/step", "lower", base.metrics.latency_ms.p95, cand.metrics.latency_ms.p95,
                (base_steps, cand_steps, _p95), note=step_note),
        _change("GPU utilisation", "%", "higher", gpu_base.util_mean_pct, gpu_cand.util_mean_pct,
                note="NVML mean over the trials; one value per run"),
        _change("peak memory", "MiB", "lower", base_memory.mb, cand_memory.mb, note=base_memory.label),
        mfu_change(base.metrics.flops, cand.metrics.flops, base.config.precision, cand.config.precision),
        *_cost_change(base, cand),
    ]


def mfu_change(base: Optional[Flops], cand: Optional[Flops], base_precision: Optional[str] = None,
               cand_precision: Optional[str] = None) -> MetricChange:
    """MFU = throughput × FLOPs per sample ÷ peak, so its change follows throughput only when both runs share
    the FLOPs and the peak; against different peaks the change is not shown, and the note says why."""
    base, cand = base or Flops(), cand or Flops()
    row = _change("MFU", "%", "higher", base.mfu_pct, cand.mfu_pct,
                  note="follows throughput: FLOPs per sample and the peak are the same")
    if row.change_pct is None:
        return row
    peak_base, peak_cand = base.peak_tflops, cand.peak_tflops
    if not math.isclose(peak_base or 0.0, peak_cand or 0.0, rel_tol=1e-6):
        row.change_pct = None
        row.note = (f"change not shown: measured against different peaks ({_peak_text(peak_base, base_precision)} vs "
                    f"{_peak_text(peak_cand, cand_precision)}); MFU = throughput × FLOPs/sample ÷ peak, so a "
                    "different peak moves MFU without any change in speed")
        return row
    flops_base, flops_cand = base.per_sample or 0.0, cand.per_sample or 0.0
    if not math.isclose(flops_base, flops_cand, rel_tol=0.005):
        row.note = (f"FLOPs per sample differ ({flops_base / 1e9:.3g} vs {flops_cand / 1e9:.3g} GFLOP): MFU moves "
                    "with throughput × FLOPs, not with throughput alone")
    return row


def _peak_text(peak: Optional[float], precision: Optional[str]) -> str:
    return f"{peak:.3g} TFLOP/s{f' {precision}' if precision else ''}" if peak else "no peak"


def _cost_change(base: Result, cand: Result) -> list[MetricChange]:
    """Cost per million samples, when both runs were given --gpu-cost-per-hour (the prices may differ)."""
    prices = base.config.gpu_cost_per_hour, cand.config.gpu_cost_per_hour
    if None in prices:
        return []
    per_trial = [[cost_per_million(price, t.throughput_samples_per_s) for t in result.trials]
                 for price, result in zip(prices, (base, cand))]
    return [_change("cost per million samples", "per 1M", "lower", base.metrics.cost_per_million_samples,
                    cand.metrics.cost_per_million_samples, (per_trial[0], per_trial[1], np.median),
                    note=f"at {prices[0]:g} and {prices[1]:g} per hour")]


def config_changes(base: Result, cand: Result) -> dict[str, list[Any]]:
    """The options that differ, as saved: {name: [base, candidate]} (a script's config saves fewer of them)."""
    saved_base, saved_cand = base.config.to_dict(), cand.config.to_dict()
    names = sorted((saved_base.keys() | saved_cand.keys()) - IGNORED_CONFIG)
    return {name: [saved_base.get(name), saved_cand.get(name)] for name in names
            if saved_base.get(name) != saved_cand.get(name)}


def comparability_warnings(base: Result, cand: Result) -> list[str]:
    """Loud warnings for comparisons across machines, software or workloads."""
    warnings = []
    env_b, env_c = base.environment, cand.environment
    gpu_b = (env_b.get("gpu") or {}).get("name") or f"CPU ({env_b.get('cpu_count')} cores)"
    gpu_c = (env_c.get("gpu") or {}).get("name") or f"CPU ({env_c.get('cpu_count')} cores)"
    if gpu_b != gpu_c:
        warnings.append(f"DIFFERENT HARDWARE: base ran on {gpu_b}, candidate on {gpu_c}; the change mixes the "
                        "machine with the levers")
    for key, what in (("torch", "torch versions"), ("cuda_runtime", "CUDA runtimes"), ("driver", "drivers")):
        if env_b.get(key) != env_c.get(key):
            warnings.append(f"DIFFERENT {what.upper()}: {env_b.get(key)} vs {env_c.get(key)}")
    for what, base_value, cand_value in (("workload", base.config.workload, cand.config.workload),
                                         ("mode", base.config.mode, cand.config.mode)):
        if base_value != cand_value:
            warnings.append(f"DIFFERENT {what.upper()}: {base_value} vs {cand_value}; "
                            "these runs measure different things")
    if base.config.batch_size != cand.config.batch_size:
        warnings.append(f"batch sizes differ ({base.config.batch_size} vs {cand.config.batch_size}): "
                        "throughput is per sample, but latency is per step of a different batch")
    return warnings


def phase_changes(base: Result, cand: Result) -> list[PhaseChange]:
    """Mean ms per step of every phase, base vs candidate, largest absolute change first."""
    base_phases, cand_phases = base.metrics.phases_ms, cand.metrics.phases_ms
    total = (cand.metrics.latency_ms.mean or 0.0) - (base.metrics.latency_ms.mean or 0.0)
    rows = []
    for name in set(base_phases) | set(cand_phases):
        b, c = base_phases.get(name, 0.0), cand_phases.get(name, 0.0)
        rows.append(PhaseChange(name, b, c, c - b, 100 * (c - b) / total if abs(total) > 1e-9 else None))
    return sorted(rows, key=lambda row: -abs(row.delta_ms))


def decide(throughput: MetricChange, quality: Optional[QualityVerdict], min_effect_pct: float
           ) -> tuple[str, list[str]]:
    """accept | reject | no significant change | inconclusive, with the reasons in the order they were weighed."""
    verdict = verdict_of(quality, None)
    if verdict == "fail":
        return REJECT, [f"the candidate failed the quality gate: {quality.reason or 'no reason recorded'}"]
    change = throughput.change_pct or 0.0
    interval = (f"{change:+.1f}% (95% CI {throughput.ci_low_pct:+.1f}% to {throughput.ci_high_pct:+.1f}%)"
                if throughput.ci_low_pct is not None else f"{change:+.1f}% (no interval)")
    if throughput.significant and change < -min_effect_pct:
        return REJECT, [f"throughput is significantly lower: {interval}"]
    if throughput.significant and change > min_effect_pct:
        reasons = [f"throughput is significantly higher: {interval}"]
        if verdict == "inconclusive":  # faster, but not shown to compute the same: no win
            return INCONCLUSIVE, [f"the quality gate was inconclusive: {quality.reason}"] + reasons
        if verdict == "pass":
            reasons.append(f"quality gate passed: {quality.reason}")
        return ACCEPT, reasons
    if throughput.significant is None:
        return INCONCLUSIVE, [f"throughput {interval}: fewer than 2 trials on a side, so no interval tells a change "
                              "from noise (use --trials 3 or more)"]
    if throughput.significant:
        return NO_CHANGE, [f"throughput {interval}: significant but smaller than the {min_effect_pct:g}% minimum "
                           "effect"]
    return NO_CHANGE, [f"throughput {interval}: the interval includes no change (inside the noise)"]


def _summary(result: Result) -> ComparedRun:
    """What a report needs from one side, so compare.json stands alone when the runs move."""
    return ComparedRun(
        path=result.path, label=describe_config(result.config, result.levers), config=copy.deepcopy(result.config),
        environment=result.environment, levers=result.levers,
        quality=result.quality.to_dict() if result.quality is not None else None,
        metrics={key: value for key, value in result.metrics.to_dict().items() if key in SUMMARY_METRICS},
        step_ms=capped_steps(result)[0].tolist(), created_utc=result.created_utc)


def describe_config(cfg: RunConfig, levers: list[str]) -> str:
    levers_text = ", ".join(levers) if levers else f"{cfg.precision}, no levers"
    return f"{cfg.workload} {cfg.mode} batch {cfg.batch_size} ({levers_text})"


def contamination(base: Result, cand: Result) -> list[tuple[str, str]]:
    """Why either run's timings are not clean, as (side, why): the machine was busy, or the run did not finish
    cleanly. A run whose own trials disagree (unsteady_spreads) is not here: its spread widens the interval instead."""
    found = []
    for side, result in (("base", base), ("candidate", cand)):
        record = result.metrics.interference
        if record is not None and record.busy:
            found.append((side, f"the {side} ran on a busy machine "
                                f"({'; '.join(busy_reasons(record)) or 'busy trials'})"))
        if result.status != "complete":
            found.append((side, f"the {side} is marked {result.status}: {result.status_reason}"))
        if result.metrics.steady is False and result.metrics.throughput_samples_per_s.range_pct is None:
            found.append((side, f"the {side} is not steady (its spread is not recorded)"))
    return found


def unsteady_spreads(base: Result, cand: Result) -> dict[str, float]:
    """side -> how far its trials disagree (%), for each side that said "not steady" (harness/steady.py)."""
    return {side: result.metrics.throughput_samples_per_s.range_pct
            for side, result in (("base", base), ("candidate", cand))
            if result.metrics.steady is False and result.metrics.throughput_samples_per_s.range_pct is not None}


def widen_by_spread(row: MetricChange, spreads: dict[str, float]) -> str:
    """Widen a ratio's interval by the spread of each unsteady side: a run whose own trials disagree by r% may sit
    anywhere in that range, so the ratio may be off by the factor (1 + r) of each. The change stays significant
    only when it is larger than all of that: an identical pair whose sides disagree by 17-24% is not judged
    -13%, while a 12x win over a base that disagrees by 43% is still a win. Returns the warning's text."""
    factor = 1.0
    for spread in spreads.values():
        factor *= 1 + spread / 100
    sides = " and ".join(f"the {side} is not steady (trials disagree by {spread:.0f}%)"
                         for side, spread in spreads.items())
    if row.ci_low_pct is None or row.ci_high_pct is None:
        return sides
    low, high = (1 + row.ci_low_pct / 100) / factor, (1 + row.ci_high_pct / 100) * factor
    row.ci_low_pct, row.ci_high_pct = 100 * (low - 1), 100 * (high - 1)
    row.significant = low > 1 or high < 1
    row.note = (row.note + "; " if row.note else "") + "interval widened by the trials' spread"
    return f"{sides}: the throughput interval is widened by that spread, so only a change larger than it is judged"


def compare_results(base: Result, cand: Result, min_effect_pct: float = MIN_EFFECT_PCT,
                    accept_noisy: bool = False) -> Comparison:
    """The full comparison of two results: metric changes, decision, phases, kernels and warnings.

    When either run was contaminated (a busy machine, an interrupted or invalid run), no change is called
    significant unless `accept_noisy`; when either run's own trials disagree, the throughput interval is widened
    by that spread (widen_by_spread)."""
    refuse_non_finite(base, cand)
    metrics = metric_changes(base, cand)
    quality = _quality_summary(base, cand)
    warnings = comparability_warnings(base, cand)
    spreads = {} if accept_noisy else unsteady_spreads(base, cand)
    unsteady = widen_by_spread(metrics[0], spreads) if spreads else None
    decision, reasons = decide(metrics[0], cand.quality, min_effect_pct)
    noisy = contamination(base, cand)
    if unsteady is not None and metrics[0].significant:  # larger than the spread: the verdict stands, and says so
        warnings.append("UNSTEADY: " + unsteady)
        reasons.append(unsteady)
    elif unsteady is not None:  # inside it: noisy, warned and refused as a busy machine is
        noisy += [(side, unsteady) for side in spreads]
    contaminated = list(dict.fromkeys(text for _, text in noisy))  # one text for both unsteady sides
    sides = [side for side in ("base", "candidate") if any(found == side for found, _ in noisy)]
    if contaminated:
        warnings.append("NOISY MEASUREMENT: " + "; ".join(contaminated))
        quality_failed = verdict_of(cand.quality) == "fail"  # a quality failure is not noise
        if not accept_noisy and not quality_failed:
            decision = NOT_JUDGED
            reasons = [f"speed not judged: {'; '.join(contaminated)}; re-run both on a quiet machine, or pass "
                       "--accept-noisy to judge anyway"] + reasons
    if cand.quality is None and config_changes(base, cand).keys() & set(numerics_fields()):
        reasons.append("no quality check recorded for the candidate: its numerics were not verified "
                       "(run it with --check-quality)")
    kernels, kernel_note = kernel_changes(base, cand)
    loop = loop_overhead_between(base.metrics.generation, cand.metrics.generation)
    return Comparison(base=_summary(base), candidate=_summary(cand), metrics=metrics, decision=decision,
                      reasons=reasons, warnings=warnings, config_changes=config_changes(base, cand),
                      phases=phase_changes(base, cand), kernels=kernels, kernel_note=kernel_note,
                      quality=quality, min_effect_pct=min_effect_pct, noisy=contaminated, accept_noisy=accept_noisy,
                      noisy_sides=sides,
                      findings=[loop.to_dict()] if loop is not None else [])


def _quality_summary(base: Result, cand: Result) -> ComparedQuality:
    quality = cand.quality or QualityVerdict()
    numbers = quality.metrics.numbers() if quality.metrics is not None else {}
    return ComparedQuality(verdict=quality.verdict, reason=quality.reason, numbers=numbers,
                           base_verdict=verdict_of(base.quality))


def regression_exceeds(comparison: Comparison, threshold_pct: float) -> bool:
    """True for a significant throughput slow-down larger than `threshold_pct` (the CI gate); never on
    contaminated timings unless they were accepted (a busy CI machine is not a regression)."""
    if comparison.noisy and not comparison.accept_noisy:
        return False
    throughput = comparison.metric("throughput")
    return bool(throughput.significant) and (throughput.change_pct or 0.0) < -abs(threshold_pct)


def compare_paths(base: Union[str, Path], candidate: Union[str, Path],
                  min_effect_pct: float = MIN_EFFECT_PCT, accept_noisy: bool = False) -> Comparison:
    return compare_results(load_result(base), load_result(candidate), min_effect_pct, accept_noisy)


__all__ = ["ACCEPT", "REJECT", "NO_CHANGE", "NOT_JUDGED", "INCONCLUSIVE", "DECISIONS", "Comparison", "MetricChange",
           "compare_results", "compare_paths", "regression_exceeds",
           "load_comparison", "load_result", "bootstrap_ratio_ci"]

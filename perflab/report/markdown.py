"""Markdown reports of a run, a sweep and a comparison. report.html is rendered from the same text."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from perflab.step.phases import phase_sort_key
from perflab.stats import interval_text
from perflab.results.metrics import Generation, Metrics
from perflab.results.quality import QualityVerdict
from perflab.report.terminal import fmt as num
from perflab.report.terminal import add_generation_rows, memory_row, no_ceiling, run_title
from perflab.results import Result
from perflab.sweep import SweepMeta, SweepPoint, best_points
from perflab.report.diagnosis import diagnosis_markdown

ENV_KEYS = ["gpu", "driver", "torch", "cuda_runtime", "cudnn", "python", "cpu", "cpu_count", "torch_threads",
            "platform", "hostname", "git_commit", "perflab"]


def cell(value: Any) -> str:
    """A value as table-cell text: pipes escaped, no line breaks."""
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float):
        text = f"{value:,.4g}"
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    elif value is None:
        text = "—"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[str] = None) -> str:
    """A GitHub-style pipe table; `align` is one letter per column (l or r)."""
    align = align or "l" * len(headers)
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(c if isinstance(c, str) else cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def image(alt: str, name: Optional[str]) -> str:
    return f"![{alt}]({name})" if name else ""


def environment_table(env: dict[str, Any]) -> str:
    rows = []
    for key in ENV_KEYS + sorted(set(env) - set(ENV_KEYS) - {"python_executable"}):
        if key not in env:
            continue
        value = env[key]
        if key == "gpu" and isinstance(value, dict):
            value = f"{value.get('name')} ({num(value.get('memory_mb'), 0)} MiB, sm {value.get('capability')})"
        rows.append([key, cell(value)])
    return table(["", "value"], rows)


def config_table(config: dict[str, Any], skip: Sequence[str] = ()) -> str:
    return table(["option", "value"], [[key, cell(value)] for key, value in config.items() if key not in skip])


def diagnosis_text(diagnosis: Optional[dict[str, Any]], run_dir: Optional[str] = None) -> str:
    """The diagnosis as Markdown, or how to get one."""
    if not diagnosis:
        hint = f" `perflab diagnose {run_dir}`" if run_dir else " `perflab diagnose RUN_DIR`"
        return f"No diagnosis recorded for this run: run{hint} (or record it with `perflab profile`)."
    return diagnosis_markdown(diagnosis)


def _phase_rows(metrics: Metrics) -> list[list[str]]:
    phases, shares = metrics.phases_ms, metrics.phase_share_pct
    names = sorted(phases, key=phase_sort_key)
    return [[name, num(phases[name], 3), num(shares.get(name), 1, "%")] for name in names]


class _Rows(list):
    """Rows collected by the terminal's row builders (they call add_row, as on a rich Table)."""

    def add_row(self, *cells: str) -> None:
        self.append(list(cells))


def generation_rows(generation: Generation) -> list[list[str]]:
    """The generation figures of a run (TTFT, TPOT, ITL, tokens/s, bandwidth bound, speculative, goodput), in the
    words of the terminal summary."""
    rows = _Rows()
    add_generation_rows(rows, generation)
    return list(rows)


def run_summary_rows(result: Result) -> list[list[str]]:
    m = result.metrics
    tp = m.throughput_samples_per_s
    lat = m.latency_ms
    rows = [["throughput", f"{num(tp.median)} samples/s ({interval_text(tp.ci95_low, tp.ci95_high, tp.n, num)}; "
                           f"spread {num(tp.range_pct)}% over {tp.n} trials)"],
            ["step latency", f"p50 {num(lat.p50, 2)} ms · p95 {num(lat.p95, 2)} ms · p99 {num(lat.p99, 2)} ms"]]
    flops = m.flops
    if flops is not None and flops.per_sample:
        mfu = f"{num(flops.mfu_pct)}% of {num(flops.peak_tflops)} TFLOP/s ({flops.peak_source})" \
            if flops.mfu_pct is not None else f"n/a ({flops.note or no_ceiling(flops.peak_source)})"
        rows.append(["compute", f"{num(flops.per_sample / 1e9, 3)} GFLOP/sample · "
                                f"{num(flops.achieved_tflops, 3)} TFLOP/s achieved · MFU {mfu}"])
    memory = memory_row(m)
    if memory:
        rows.append(list(memory))
    gpu = m.gpu
    if gpu is not None and gpu.samples:
        rows.append(["GPU (NVML)", f"utilisation mean {num(gpu.util_mean_pct)}% (min "
                                   f"{num(gpu.util_min_pct, 0)}%) · SM clock {num(gpu.sm_clock_median_mhz, 0)} MHz"])
    if m.cost_per_million_samples is not None:
        rows.append(["cost", f"{num(m.cost_per_million_samples, 3)} per million samples at "
                             f"{result.config.gpu_cost_per_hour:g} per hour (--gpu-cost-per-hour)"])
    if m.generation is not None:  # TTFT, TPOT, tokens/s, the share of the bandwidth bound: as the terminal shows them
        rows += generation_rows(m.generation)
    rows.append(["levers", ", ".join(result.levers) or "none (baseline)"])
    warm = f"{num(m.warmup_s, 2)} s"
    if m.compile_s is not None:
        warm += f" (compile/capture, first step: {num(m.compile_s, 2)} s)"
    rows.append(["warm-up", warm])
    if result.quality:
        rows.append(["quality gate", f"**{result.quality.verdict}**: {result.quality.reason}"])
    return [[name, cell(text)] for name, text in rows]


def run_markdown(result: Result, images: dict[str, str], run_dir: Optional[str] = None) -> str:
    cfg = result.config
    trial_rows = [[str(i + 1), num(t.throughput_samples_per_s), num(t.wall_s, 3), str(t.steps),
                   num(sorted(t.step_ms)[len(t.step_ms) // 2] if t.step_ms else None, 2)]
                  for i, t in enumerate(result.trials)]
    parts = [
        "# " + run_title(result).replace(" · ", ": ", 1),
        f"Measured {result.created_utc or 'n/a'} with perflab {result.perflab_version}. Command: "
        f"`{' '.join(result.command)}`",
        "## Summary", table(["metric", "value"], run_summary_rows(result)),
        "## Step-time breakdown", table(["phase", "ms per step", "share"], _phase_rows(result.metrics), "lrr"),
        image("step-time breakdown", images.get("breakdown")),
        image("per-step latency", images.get("latency")),
        f"Phases: {result.timing.get('phases', 'n/a')}. Latency: {result.timing.get('latency', 'n/a')}.",
        "## Trials", table(["trial", "samples/s", "wall s", "steps", "p50 ms"], trial_rows, "rrrrr"),
    ]
    diagnosis = diagnosis_text(result.diagnosis, run_dir)
    parts += [diagnosis] if diagnosis.lstrip().startswith("## Diagnosis") else ["## Diagnosis", diagnosis]
    parts.append(image("top ops by device time, coloured by roofline place", images.get("top_ops")))
    if result.quality:
        parts += ["## Quality gate", quality_block(result.quality)]
    if result.notes:
        parts += ["## Notes", "\n".join(f"- {note}" for note in result.notes)]
    parts += ["## Configuration", config_table(cfg.to_dict()), "## Environment", environment_table(result.environment),
              "## How this was measured", "\n".join(f"- **{k}**: {v}" for k, v in result.timing.items()
                                                    if isinstance(v, str))]
    return "\n\n".join(part for part in parts if part) + "\n"


def quality_block(quality: QualityVerdict) -> str:
    numbers = quality.metrics.numbers() if quality.metrics is not None else {}
    text = f"**{quality.verdict}**: {quality.reason}"
    if quality.baseline:
        text += f"\n\nBaseline: {quality.baseline}."
    if numbers:
        text += "\n\n" + table(["figure", "value"], [[k, cell(v)] for k, v in numbers.items()])
    return text


def sweep_markdown(meta: SweepMeta, points: list[SweepPoint], images: dict[str, str],
                   environment: Optional[dict[str, Any]]) -> str:
    base, axes = meta.base_config, meta.axes
    best, bounded = best_points(points, meta.max_p95_ms)
    params = list(dict.fromkeys(name for point in points for name in point.params))
    counts = {status: sum(point.status == status for point in points) for status in ("ok", "oom", "error")}
    lines = [f"- **best throughput**: {_point_text(best)}" if best else "- no point finished successfully"]
    if meta.max_p95_ms is not None:
        lines.append(f"- **best with p95 ≤ {meta.max_p95_ms:g} ms**: "
                     + (_point_text(bounded) if bounded else "no point meets the bound"))
    lines.append(f"- points: {len(points)} finished ({counts['ok']} ok, {counts['oom']} out of memory, "
                 f"{counts['error']} refused or failed)" + (f" of {meta.points_planned} planned"
                                                            if meta.points_planned else ""))
    if meta.mode == "auto-batch":
        lines.append(f"- auto-batch: doubling until out of memory or growth below {meta.growth_pct}%")
    point_rows = []
    for point in points:
        ok = point.ok
        star = " ★" if best and point.key == best.key else ""
        point_rows.append([str(point.index)] + [cell(point.params.get(p)) for p in params] + [
            point.status + star, num(point.throughput) if ok else "",
            interval_text(point.throughput_ci_low, point.throughput_ci_high, point.trials,
                          num).removeprefix("95% CI ") if ok else "",
            num(point.p50_ms, 2) if ok else "", num(point.p95_ms, 2) if ok else "",
            num(point.peak_memory_mb, 0) if ok else "", num(point.gpu_util_pct) if ok else "",
            num(point.mfu_pct) if ok else "", cell(point.quality) if ok else cell(point.error)])
    headers = ["#"] + [p.replace("_size", "") for p in params] + [
        "status", "samples/s", "95% CI", "p50 ms", "p95 ms", "peak MiB", "GPU util %", "MFU %", "quality / error"]
    memory_kind = next((point.memory_kind for point in points if point.ok), "")
    parts = [f"# perflab sweep: {base.get('workload')} · {base.get('mode')} · over {', '.join(axes) or 'nothing'}",
             f"Command: `{' '.join(meta.command)}`" if meta.command else "",
             "## Result", "\n".join(lines),
             "## Points", table(headers, point_rows, "r" * (1 + len(params)) + "l" + "r" * 7 + "l"),
             f"Latency is per step (one batch). Peak memory: {memory_kind}." if memory_kind else "",
             "## Plots", *(image(name, path) for name, path in images.items()),
             "## Fixed configuration (not swept)", config_table(base, skip=list(axes) + ["out"])]
    if environment:
        parts += ["## Environment (first point)", environment_table(environment)]
    return "\n\n".join(part for part in parts if part) + "\n"


def _point_text(point: SweepPoint) -> str:
    return (f"{point.label}: {num(point.throughput)} samples/s, p50 {num(point.p50_ms, 2)} ms, "
            f"p95 {num(point.p95_ms, 2)} ms (`{point.dir}`)")


def compare_markdown(comparison, images: dict[str, str]) -> str:
    base, cand = comparison.base, comparison.candidate
    metric_rows = []
    for m in comparison.metrics:
        digits = 2 if m.unit == "ms/step" else 1
        significant = {True: "yes, better" if m.improved else "yes, worse", False: "no", None: "—"}[m.significant]
        metric_rows.append([f"{m.name} ({m.unit})", num(m.base, digits), num(m.candidate, digits),
                            "n/a" if m.change_pct is None else f"{m.change_pct:+.1f}%",
                            (m.interval_note or "—") if m.ci_low_pct is None else
                            f"{m.ci_low_pct:+.1f}% … {m.ci_high_pct:+.1f}%",
                            significant, cell(m.note)])
    q = comparison.quality
    metric_rows.append(["quality", q.base_verdict, q.verdict, "", "", "", cell(q.reason)])
    phase_rows = [[p.phase, num(p.base_ms, 3), num(p.candidate_ms, 3), f"{p.delta_ms:+.3f}",
                   num(p.share_of_change_pct, 0, "%")] for p in comparison.phases]
    parts = [f"# perflab compare: {base.label} → {cand.label}",
             f"Baseline `{base.path}` · candidate `{cand.path}`"]
    if comparison.warnings:
        parts += ["## ⚠ Warnings", "\n".join(f"- **{w}**" for w in comparison.warnings)]
    parts += [f"## Decision: {comparison.decision.upper()}", "\n".join(f"- {r}" for r in comparison.reasons),
              "## Performance report",
              table(["metric", "baseline", "candidate", "change", "95% CI of change", "significant", "note"],
                    metric_rows, "lrrrrll"),
              f"Method: {comparison.method}. Minimum effect for a decision: {comparison.min_effect_pct:g}%."]
    if comparison.config_changes:
        parts += ["## What changed", table(["option", "baseline", "candidate"],
                                           [[k, cell(v[0]), cell(v[1])] for k, v in comparison.config_changes.items()])]
    parts += ["## Where the time went: phases",
              table(["phase", "baseline ms", "candidate ms", "Δ ms", "share of Δ"], phase_rows, "lrrrr"),
              image("step-time breakdown", images.get("breakdown")), image("per-step latency", images.get("latency")),
              "## Kernels"]
    if comparison.kernels:
        parts.append(table(["kernel", "baseline ms", "candidate ms", "Δ ms"],
                           [[k.kernel, num(k.base_ms, 3), num(k.candidate_ms, 3), f"{k.delta_ms:+.3f}"]
                            for k in comparison.kernels], "lrrr"))
    parts.append(comparison.kernel_note)
    if q.numbers:
        parts += ["## Quality figures (candidate)", table(["figure", "value"],
                                                          [[k, cell(v)] for k, v in q.numbers.items()])]
    env_keys = [k for k in ENV_KEYS if k in base.environment or k in cand.environment]
    parts += ["## Environment", table(["", "baseline", "candidate"], [
        [k, cell(_env_value(base.environment.get(k))), cell(_env_value(cand.environment.get(k)))]
        for k in env_keys])]
    return "\n\n".join(part for part in parts if part) + "\n"


def _env_value(value: Any) -> Any:
    return value.get("name") if isinstance(value, dict) and "name" in value else value

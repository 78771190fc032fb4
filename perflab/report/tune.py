"""The report of a tune directory: the chain of decisions, a waterfall of the gains, the breakdown before and
after, predicted against measured gain, and the recipe. report.html is rendered from the same Markdown."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from perflab.report.markdown import cell, config_table, environment_table, image, num, table
from perflab.report.plots import phase_breakdown_plot, waterfall_plot
from perflab.results import RESULT_FILE, Result, read_json_object, validate
from perflab.tune.output import TUNE_JSON, objective_figure
from perflab.tune.recipe import Recipe
from perflab.tune.summary import Side, TuneSummary


def _objective(meta: TuneSummary) -> tuple[str, str, str]:
    """The figure the tune raised (its row key), its unit, and the p99 bound it was held to (max-qps)."""
    objective = meta.objective
    key, unit = objective_figure(objective.name)
    bound = f" at p99 ≤ {objective.p99_ms:g} ms" if objective.p99_ms is not None else ""
    return key, unit, bound


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def _interval(ci: Optional[list], resolution_pct: Optional[float] = None) -> str:
    if resolution_pct is not None:  # max-qps: the gain had to beat the search's resolution
        return f"res. ±{resolution_pct:g}%"
    if not ci or ci[0] is None:
        return "—"
    return f"{ci[0]:+.1f}% … {ci[1]:+.1f}%"


def _load(directory: Path, side: Optional[Side]) -> Optional[Result]:
    if side is None or not side.dir or not (directory / side.dir / RESULT_FILE).is_file():
        return None
    return Result.load(directory / side.dir)


@dataclass
class TuneImages:
    """The plots of a tune's report, as file names in its folder (None: not drawn)."""

    waterfall: Optional[str] = None
    breakdown: Optional[str] = None


def tune_images(directory: Path, meta: TuneSummary, out: Path) -> TuneImages:
    """The waterfall of kept gains and the step-time breakdown of the start and the tuned best."""
    images = TuneImages()
    start = meta.start or Side()
    key, unit, _ = _objective(meta)
    kept = [(link.label, link.figure(key)) for link in meta.chain if link.kept]
    if start.figure(key):
        waterfall_plot("start", start.figure(key), kept, out / "tune_waterfall.png", unit=unit)
        images.waterfall = "tune_waterfall.png"
    before, after = _load(directory, meta.start), _load(directory, meta.best)
    # a serve trial has no per-phase step times (its profiles do; the chain's diagnoses read those)
    if before is not None and after is not None and before.metrics.phases_ms and after.metrics.phases_ms:
        phase_breakdown_plot({"start": before.metrics.phases_ms, "tuned": after.metrics.phases_ms},
                             out / "tune_breakdown.png",
                             "step-time breakdown: start vs tuned")
        images.breakdown = "tune_breakdown.png"
    return images


def _kept(meta: TuneSummary) -> str:
    """'bf16, channels-last', or 'nothing', then any screened win left unconfirmed: never 'nothing' alone when a
    screen won."""
    kept = ", ".join(meta.kept) or "nothing"
    return "; ".join([kept, *(win.recipe_line() for win in meta.recipe.unconfirmed)])


def _unconfirmed_wins(recipe: Recipe) -> str:
    """The screened wins the budget left unconfirmed (not in the recipe above), each with its confirming command."""
    return "\n\n".join(f"{win.recipe_line()}; not in the recipe above. Confirm it (full trials, the quality gate) "
                        f"with:\n\n```\n{win.command}\n```" for win in recipe.unconfirmed)


def tune_markdown(directory: Path, meta: TuneSummary, images: TuneImages) -> str:
    start, best = meta.start or Side(), meta.best or Side()
    config = meta.recipe.config
    chain_rows = [[link.name, cell(link.bottleneck), link.label, _pct(link.predicted_gain_pct),
                   _pct(link.measured_gain_pct), _interval(link.ci95_pct, link.resolution_pct), cell(link.quality),
                   "**kept**" if link.kept else "rejected", cell(link.why),
                   num(link.wall_s, 1), num(link.compile_s or link.warmup_s, 1)]
                  for link in meta.chain]
    speedup = meta.speedup
    key, unit, bound = _objective(meta)
    summary = [f"- **{num(start.figure(key))} → {num(best.figure(key))} {unit}{bound}**"
               + (f" ({speedup:.2f}×)" if speedup else ""),
               f"- kept: {_kept(meta)}; lost: {', '.join(meta.lost) or 'nothing'}",
               f"- {meta.trials} trials in {num(meta.spent_s, 0)} s of a "
               f"{num(meta.budget_s, 0)} s budget (warm-up and compilation: "
               f"{num(meta.compile_and_warmup_s, 0)} s of it)",
               f"- stopped: {meta.stop_reason or None}"]
    screened_rows = [[cell(entry.trial), entry.label, _pct(entry.screened_gain_pct),
                      "win" if entry.win else "—", cell(entry.outcome), num(entry.wall_s, 1), num(entry.compile_s, 1)]
                     for entry in meta.screened]
    if meta.unconfirmed:
        summary.append("- screened but not confirmed (not in the recipe): " + "; ".join(meta.unconfirmed))
    if meta.compile_s:
        summary.append(f"- compilation measured in the trials: {num(meta.compile_s, 0)} s")
    diagnosis_rows = [[d.trial, d.after, cell(d.bottleneck), num(d.confidence, 2), cell(d.headline or None),
                       cell(", ".join(d.levers or []))]
                      for d in meta.diagnoses]
    recipe = meta.recipe
    parts = [f"# perflab tune: {config.get('workload')} · {config.get('mode')} · {config.get('device')}",
             f"Command: `{' '.join(meta.command)}`" if meta.command else "",
             "## Result", "\n".join(summary),
             image(f"{unit} waterfall", images.waterfall),
             "## The recipe", f"```\n{recipe.command}\n```", f"```python\n{recipe.snippet}\n```",
             _unconfirmed_wins(recipe),
             "## The chain of decisions",
             table(["trial", "bottleneck", "lever", "predicted", "measured", "95% CI", "quality", "decision", "why",
                    "wall s", "compile/warm-up s"], chain_rows, "lllrrrllllr") if chain_rows else "No lever was tried.",
             "Predicted: the throughput gain if the share of the step the diagnosis's finding explains vanished "
             "(n/a where the diagnosis gives no share). "
             + ("Measured: the change of the max QPS (`perflab serve --find-max-qps`) against the best so far; a "
                "lever is kept when it beats the search's resolution and --min-effect-pct."
                if key == "max_qps" else
                "Measured: compare's change of the median throughput against the best so far, with its bootstrap "
                "interval."),
             *(["## Screening",
                "Every candidate got one short trial (one timed trial, no quality gate) against a short trial of the "
                "best so far; only a screened win was confirmed by the full trials, compare's decision and the "
                "quality gate above.",
                table(["trial", "lever", "screened", "", "outcome", "wall s", "compile s"], screened_rows, "llrllrr")]
               if screened_rows else []),
             "## Diagnoses", table(["profile", "of", "bottleneck", "confidence", "headline", "levers"],
                                   diagnosis_rows) if diagnosis_rows else "",
             "## Step-time breakdown, before and after", image("step-time breakdown", images.breakdown)]
    if meta.skipped:
        parts += ["## Not tried", table(["lever", "why"], [[k, cell(v)] for k, v in meta.skipped.items()])]
    if meta.notes:
        parts += ["## Notes", "\n".join(f"- {note}" for note in meta.notes)]
    parts += ["## Tuned configuration", config_table(config, skip=["out"])]
    best_result = _load(directory, best)
    if best_result is not None:
        parts += ["## Environment", environment_table(best_result.environment)]
    return "\n\n".join(part for part in parts if part) + "\n"


LINK_NUMBERS = ("predicted_gain_pct", "measured_gain_pct", "resolution_pct", "wall_s", "compile_s", "warmup_s",
                "throughput", "max_qps", "screened_gain_pct")


def check_tune_record(meta: dict[str, Any], path: Path) -> None:
    """The figures the report formats are numbers: a hand-edited string is refused in one line, not a ValueError."""
    validate.numbers(meta, ("speedup", "trials", "spent_s", "budget_s", "compile_and_warmup_s", "compile_s"), path)
    validate.number(validate.section(meta, "objective", path), "p99_ms", path, prefix="objective.")
    for side in ("start", "best"):
        validate.numbers(validate.section(meta, side, path), ("throughput", "max_qps"), path, prefix=f"{side}.")
    for field in ("chain", "screened"):
        for index, link in enumerate(validate.objects(meta, field, path)):
            validate.numbers(link, LINK_NUMBERS, path, prefix=f"{field}[{index}].")
            validate.number_list(link, "ci95_pct", path, prefix=f"{field}[{index}].")
    for index, diagnosis in enumerate(validate.objects(meta, "diagnoses", path)):
        validate.number(diagnosis, "confidence", path, prefix=f"diagnoses[{index}].")


def tune_report(directory: Path, out: Path) -> str:
    """The Markdown of a tune directory (its tune.json), writing its plots into `out`."""
    recorded = read_json_object(directory / TUNE_JSON, "a perflab tune record", "re-run perflab tune")
    check_tune_record(recorded, directory / TUNE_JSON)
    meta = TuneSummary.from_dict(recorded)
    return tune_markdown(directory, meta, tune_images(directory, meta, out))

"""tune.json: the objective, the chain of decisions (bottleneck -> lever -> predicted -> measured -> quality ->
kept or not), the start and the best, why the search stopped, and the recipe."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from perflab.results import write_json_atomic
from perflab.tune.decision import unjudged_line
from perflab.tune.recipe import recipe, recipe_text
from perflab.tune.settings import MAX_QPS
from perflab.tune.stop import StopReason

# The figure each objective raises, as tune.json's rows name it, and its unit.
OBJECTIVE_FIGURES = {"throughput": ("throughput", "samples/s"), MAX_QPS: ("max_qps", "q/s")}

TUNE_JSON = "tune.json"
CHAIN_KEYS = ("name", "lever", "label", "bottleneck", "proposed_by", "finding_confidence", "predicted_step_share_pct",
              "predicted_gain_pct", "measured_gain_pct", "status", "throughput", "max_qps", "p99_ms", "peak_memory_mb",
              "wall_s", "warmup_s", "compile_s", "against", "dir", "stage", "screened_gain_pct", "screen_trial",
              "confirmation", "trade", "warm")


def chain_link(row: dict[str, Any]) -> dict[str, Any]:
    """One decision of the chain, flat enough to read in tune.json and to print as a table row."""
    decision = row.get("decision") or {}
    link = {key: row.get(key) for key in CHAIN_KEYS}
    link.update(ci95_pct=decision.get("ci95_pct"), quality=decision.get("quality"), verdict=decision.get("verdict"),
                kept=bool(decision.get("kept")), why=decision.get("why"), judged=decision.get("judged", True))
    if decision.get("objective") == MAX_QPS:  # what the candidate's max QPS was judged against, and how finely
        link.update(objective=MAX_QPS, against_max_qps=decision.get("against_value"),
                    resolution_pct=decision.get("resolution_pct"))
    return link


def objective_figure(objective: str) -> tuple[str, str]:
    """The row key of the figure an objective raises, and its unit."""
    return OBJECTIVE_FIGURES.get(objective, OBJECTIVE_FIGURES["throughput"])


def speedup(start: Optional[dict[str, Any]], best: Optional[dict[str, Any]], key: str = "throughput"
            ) -> Optional[float]:
    if not start or not best or not start.get(key) or best.get(key) is None:
        return None
    return best[key] / start[key]


def objective_summary(settings) -> dict[str, Any]:
    """What the search raised: its name, the figure and unit, and for max-qps the bound and the resolution."""
    key, unit = objective_figure(settings.objective)
    summary = {"name": settings.objective, "figure": key, "unit": unit}
    if settings.serve is not None:
        summary.update(p99_ms=settings.serve.p99_ms, resolution_pct=settings.serve.search_tolerance_pct,
                       min_effect_pct=settings.min_effect_pct, serve=settings.serve.to_dict())
    return summary


def tune_summary(tuner, stop_reason: str, command: list[str], stop: Optional[StopReason] = None) -> dict[str, Any]:
    """Everything tune.json holds, from a Tuner that has run (or was interrupted); `stop`: why it stopped, as a
    value (None while it runs)."""
    start, best = tuner.baseline_row, tuner.best_row
    trials = tuner.journal.ordered()
    objective = objective_summary(tuner.settings)
    return {
        "kind": "tune",
        "command": command,
        "objective": objective,
        "settings": tuner.settings.to_dict(),
        "budget_s": tuner.settings.budget_s,
        "spent_s": round(tuner.spent_s, 1),
        "compile_and_warmup_s": round(sum((row.get("warmup_s") or 0.0) for row in trials), 1),
        "compile_s": round(sum((row.get("compile_s") or 0.0) for row in trials), 1),  # measured, per trial
        "screened": tuner.screener.summary() if tuner.screener is not None else [],
        "unconfirmed": [win.describe() for win in tuner.unconfirmed],
        "trials": len(trials),
        "warm_trials": sum(1 for row in trials if row.get("warm")),  # run by the warm worker (perflab/tune/warm.py)
        "stop_reason": stop_reason,
        "stop": stop.to_dict() if stop is not None else None,
        "profile_cut": tuner.profile_cut,
        "start": _side(start),
        "best": _side(best),
        "speedup": speedup(start, best, objective["figure"]),
        "kept": [link["label"] for link in map(chain_link, tuner.chain) if link["kept"]],
        "lost": list(tuner.lost),
        "skipped": tuner.skipped,
        "diagnoses": tuner.diagnoses,
        "chain": [chain_link(row) for row in tuner.chain],
        "notes": list(tuner.notes),
        "not_judged": unjudged_line([row.get("decision") for row in tuner.chain]),
        "recipe": recipe(tuner.best_cfg, tuner.start, tuner.serve_cfg, tuner.unconfirmed),
    }


def _side(row: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if row is None:
        return None
    return {key: row.get(key) for key in ("name", "label", "dir", "throughput", "throughput_ci95", "max_qps",
                                          "resolution_pct", "p50_ms", "p99_ms", "peak_memory_mb", "mfu_pct",
                                          "quality")}


RECIPE_FILE = "recipe.txt"


def write_tune_json(out: Path, summary: dict[str, Any]) -> Path:
    """tune.json, and recipe.txt beside it: the best confirmed recipe's command line and Python snippet, then each
    screened win left unconfirmed with the command that confirms it."""
    path = Path(out) / TUNE_JSON
    write_json_atomic(path, summary)
    temporary = Path(out) / (RECIPE_FILE + ".tmp")
    temporary.write_text(recipe_text(summary.get("recipe") or {}))
    temporary.replace(Path(out) / RECIPE_FILE)
    return path

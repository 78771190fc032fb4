"""tune.json: the chain of decisions (bottleneck -> lever -> predicted -> measured -> quality -> kept or not),
the start and the best, why the search stopped, and the recipe."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from perflab.results import write_json_atomic
from perflab.tune.recipe import recipe

TUNE_JSON = "tune.json"
CHAIN_KEYS = ("name", "lever", "label", "bottleneck", "proposed_by", "finding_confidence", "predicted_step_share_pct",
              "predicted_gain_pct", "measured_gain_pct", "status", "throughput", "p99_ms", "peak_memory_mb",
              "wall_s", "warmup_s", "compile_s", "against", "dir")


def chain_link(row: dict[str, Any]) -> dict[str, Any]:
    """One decision of the chain, flat enough to read in tune.json and to print as a table row."""
    decision = row.get("decision") or {}
    link = {key: row.get(key) for key in CHAIN_KEYS}
    link.update(ci95_pct=decision.get("ci95_pct"), quality=decision.get("quality"), verdict=decision.get("verdict"),
                kept=bool(decision.get("kept")), why=decision.get("why"))
    return link


def speedup(start: Optional[dict[str, Any]], best: Optional[dict[str, Any]]) -> Optional[float]:
    if not start or not best or not start.get("throughput"):
        return None
    return best["throughput"] / start["throughput"]


def tune_summary(tuner, stop_reason: str, command: list[str]) -> dict[str, Any]:
    """Everything tune.json holds, from a Tuner that has run (or was interrupted)."""
    start, best = tuner.baseline_row, tuner.best_row
    trials = tuner.journal.ordered()
    return {
        "kind": "tune",
        "command": command,
        "settings": tuner.settings.to_dict(),
        "budget_s": tuner.settings.budget_s,
        "spent_s": round(tuner.spent_s, 1),
        "compile_and_warmup_s": round(sum((row.get("warmup_s") or 0.0) for row in trials), 1),
        "trials": len(trials),
        "stop_reason": stop_reason,
        "start": _side(start),
        "best": _side(best),
        "speedup": speedup(start, best),
        "kept": [link["label"] for link in map(chain_link, tuner.chain) if link["kept"]],
        "lost": list(tuner.lost),
        "skipped": tuner.skipped,
        "diagnoses": tuner.diagnoses,
        "chain": [chain_link(row) for row in tuner.chain],
        "notes": list(tuner.notes),
        "recipe": recipe(tuner.best_cfg, tuner.start),
    }


def _side(row: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if row is None:
        return None
    return {key: row.get(key) for key in ("name", "label", "dir", "throughput", "throughput_ci95", "p50_ms", "p99_ms",
                                          "peak_memory_mb", "mfu_pct", "quality")}


def write_tune_json(out: Path, summary: dict[str, Any]) -> Path:
    path = Path(out) / TUNE_JSON
    write_json_atomic(path, summary)
    return path

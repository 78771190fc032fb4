"""tune.json: the objective, the chain of decisions (bottleneck -> lever -> predicted -> measured -> quality ->
kept or not), the start and the best, why the search stopped, and the recipe."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from perflab.results import write_json_atomic
from perflab.tune.decision import unjudged_line
from perflab.tune.recipe import recipe, recipe_text
from perflab.tune.rows import TrialRow
from perflab.tune.settings import MAX_QPS, THROUGHPUT
from perflab.tune.stop import StopReason
from perflab.tune.summary import ChainLink, ObjectiveSummary, Side, TuneSummary

# The figure each objective raises, as tune.json's rows name it, and its unit.
OBJECTIVE_FIGURES = {THROUGHPUT: ("throughput", "samples/s"), MAX_QPS: ("max_qps", "q/s")}

TUNE_JSON = "tune.json"


def objective_figure(objective: str) -> tuple[str, str]:
    """The row key of the figure an objective raises, and its unit."""
    return OBJECTIVE_FIGURES.get(objective, OBJECTIVE_FIGURES[THROUGHPUT])


def speedup(start: Optional[Union[TrialRow, Side]], best: Optional[Union[TrialRow, Side]], key: str = "throughput"
            ) -> Optional[float]:
    """The best's figure over the start's (None without both)."""
    before, after = (start.figure(key) if start else None), (best.figure(key) if best else None)
    if not before or after is None:
        return None
    return after / before


def objective_summary(settings) -> ObjectiveSummary:
    """What the search raised: its name, the figure and unit, and for max-qps the bound and the resolution."""
    key, unit = objective_figure(settings.objective)
    summary = ObjectiveSummary(settings.objective, key, unit)
    if settings.serve is not None:
        summary.p99_ms, summary.resolution_pct = settings.serve.p99_ms, settings.serve.search_tolerance_pct
        summary.min_effect_pct, summary.serve = settings.min_effect_pct, settings.serve.to_dict()
    return summary


def tune_summary(tuner, stop_reason: str, command: list[str], stop: Optional[StopReason] = None) -> TuneSummary:
    """Everything tune.json holds, from a Tuner that has run (or was interrupted); `stop`: why it stopped, as a
    value (None while it runs)."""
    state = tuner.state
    start, best = state.baseline_row, state.best_row
    trials = tuner.journal.ordered()
    objective = objective_summary(tuner.settings)
    chain = [ChainLink.of(row) for row in state.chain]
    return TuneSummary(
        objective=objective, command=command, settings=tuner.settings.to_dict(),
        budget_s=tuner.settings.budget_s, spent_s=round(tuner.spent_s, 1),
        compile_and_warmup_s=round(sum((row.warmup_s or 0.0) for row in trials), 1),
        compile_s=round(sum((row.compile_s or 0.0) for row in trials), 1),
        screened=tuner.screener.summary() if tuner.screener is not None else [],
        unconfirmed=[win.describe() for win in state.unconfirmed],
        trials=len(trials), warm_trials=sum(1 for row in trials if row.warm),
        stop_reason=stop_reason, stop=stop.to_dict() if stop is not None else None,
        profile_cut=tuner.profiler.profile_cut,
        start=Side.of(start) if start is not None else None, best=Side.of(best) if best is not None else None,
        speedup=speedup(start, best, objective.figure),
        kept=[link.label for link in chain if link.kept], lost=list(state.lost), skipped=state.skipped,
        diagnoses=list(tuner.profiler.diagnoses), chain=chain, notes=list(state.notes),
        not_judged=unjudged_line([row.decision for row in state.chain]),
        recipe=recipe(state.best_cfg, state.start, state.serve_cfg, state.unconfirmed))


RECIPE_FILE = "recipe.txt"


def write_tune_json(out: Path, summary: TuneSummary) -> Path:
    """tune.json, and recipe.txt beside it: the best confirmed recipe's command line and Python snippet, then each
    screened win left unconfirmed with the command that confirms it."""
    path = Path(out) / TUNE_JSON
    write_json_atomic(path, summary.to_dict())
    temporary = Path(out) / (RECIPE_FILE + ".tmp")
    temporary.write_text(recipe_text(summary.recipe))
    temporary.replace(Path(out) / RECIPE_FILE)
    return path

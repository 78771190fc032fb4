"""The tuned configuration as a user takes it away: a `perflab run` command line and a RunConfig(...) snippet;
with --objective max-qps, the `perflab serve` command line and RunConfig(...) plus ServeConfig(...). A screened win
the budget left no room to confirm is listed beside it ("screened, not confirmed: +X% (screen)"), never in it, with
the `perflab run ...` that confirms it."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from perflab import options
from perflab.config import RunConfig
from perflab.serve.config import ServeConfig
from perflab.tune.objective import serve_argv
from perflab.results.records import Record

# Fields tune sets on its trials only (the quality gate on every candidate); the recipe keeps the user's own.
TRIAL_ONLY_FIELDS = ("check_quality", "quality_rtol", "quality_loss_rtol")


def recipe_config(best: RunConfig, start: RunConfig) -> RunConfig:
    """The best config with the trial-only settings put back to what the user started with."""
    return best.replace(**{name: getattr(start, name) for name in TRIAL_ONLY_FIELDS})


def recipe_argv(cfg: RunConfig) -> list[str]:
    """The run options of the tuned configuration, always naming the workload (even the default one)."""
    argv = cfg.to_argv("run")
    return argv if "--workload" in argv else ["--workload", cfg.workload, *argv]


def recipe_command(cfg: RunConfig) -> str:
    """`perflab run ...` that measures the tuned configuration."""
    return shlex.join(["perflab", "run", *recipe_argv(cfg)])


def recipe_snippet(cfg: Any) -> str:
    """`RunConfig(...)` (or any config's) with every field that differs from its default, for `perflab.run(...)`
    (or `perflab.serve.serve(...)`) from Python."""
    parts = []
    for declared in options.options_of(type(cfg)):
        value = getattr(cfg, declared.name)
        if declared.name == "out" or value == declared.default or (value is None and declared.default is None):
            continue
        parts.append(f"{declared.name}={value!r}")
    return f"{type(cfg).__name__}(" + ", ".join(parts) + ")"


def _gain_text(gain: Optional[float]) -> str:
    return "n/a" if gain is None else f"{gain:+.0f}%"


@dataclass(frozen=True)
class UnconfirmedWin(Record):
    """A screened win the budget left no room to confirm: never kept, but in the recipe with the command that
    confirms it (a full run of the best plus the lever, with the quality gate)."""

    label: str
    screened_gain_pct: Optional[float]
    outcome: str  # not confirmed: why
    command: str

    def describe(self) -> str:
        """'compile=default screened +40%, not confirmed: budget (...)' for the stop line and the report."""
        return f"{self.label} screened {_gain_text(self.screened_gain_pct)}, {self.outcome}"

    def recipe_line(self) -> str:
        """'compile=default: screened, not confirmed: +40% (screen)' for the recipe."""
        return f"{self.label}: screened, not confirmed: {_gain_text(self.screened_gain_pct)} (screen)"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "screened_gain_pct": self.screened_gain_pct, "outcome": self.outcome,
                "line": self.recipe_line(), "command": self.command}


@dataclass
class Recipe(Record):
    """tune.json's recipe: the command line, its argv and Python snippet, the tuned config (and serve settings), and
    the screened wins left unconfirmed."""

    command: str = ""
    argv: list[str] = field(default_factory=list)
    snippet: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    serve: Optional[dict[str, Any]] = None  # --objective max-qps: the serve settings
    unconfirmed: list[UnconfirmedWin] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        record = {"command": self.command, "argv": self.argv, "snippet": self.snippet, "config": self.config}
        if self.serve is not None:
            record.update(serve=self.serve)
        return {**record, "unconfirmed": [win.to_dict() for win in self.unconfirmed]}


def recipe(best: RunConfig, start: RunConfig, serve: Optional[ServeConfig] = None,
           unconfirmed: Sequence[UnconfirmedWin] = ()) -> Recipe:
    """The recipe of the tuned config: `perflab run ...`, or `perflab serve ...` for the max-qps objective; with the
    screened wins left unconfirmed (each "screened, not confirmed: +X% (screen)" and the command that confirms it)."""
    cfg = recipe_config(best, start)
    if serve is not None:
        argv = serve_argv(cfg, serve)
        return Recipe(shlex.join(["perflab", "serve", *argv]), argv,
                      f"serve({recipe_snippet(cfg)}, {recipe_snippet(serve)})", cfg.to_dict(), serve.to_dict(),
                      list(unconfirmed))
    return Recipe(recipe_command(cfg), recipe_argv(cfg), recipe_snippet(cfg), cfg.to_dict(),
                  unconfirmed=list(unconfirmed))


def recipe_text(recorded: Recipe) -> str:
    """recipe.txt: the command line and the snippet of the best confirmed recipe, then each screened win left
    unconfirmed (not in the recipe) with the command that confirms it."""
    written = f"{recorded.command}\n\n{recorded.snippet}\n"
    for win in recorded.unconfirmed:
        written += (f"\n# {win.recipe_line()}; not in the recipe above. Confirm it (full trials, the quality gate) "
                    f"with:\n{win.command}\n")
    return written

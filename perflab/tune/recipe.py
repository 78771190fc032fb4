"""The tuned configuration as a user takes it away: a `perflab run` command line and a RunConfig(...) snippet;
with --objective max-qps, the `perflab serve` command line and RunConfig(...) plus ServeConfig(...). A screened win
the budget left no room to confirm is listed beside it ("screened, not confirmed: +X% (screen)"), never in it, with
the `perflab run ...` that confirms it."""
from __future__ import annotations

import shlex
from typing import Any, Optional, Sequence

from perflab import options
from perflab.config import RunConfig
from perflab.serve.config import ServeConfig
from perflab.tune.objective import serve_argv

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


def recipe(best: RunConfig, start: RunConfig, serve: Optional[ServeConfig] = None,
           unconfirmed: Sequence[Any] = ()) -> dict[str, Any]:
    """The recipe of the tuned config: `perflab run ...`, or `perflab serve ...` for the max-qps objective; with the
    screened wins left unconfirmed (each "screened, not confirmed: +X% (screen)" and the command that confirms it)."""
    cfg = recipe_config(best, start)
    left = {"unconfirmed": [win.to_dict() for win in unconfirmed]}
    if serve is not None:
        argv = serve_argv(cfg, serve)
        return {"command": shlex.join(["perflab", "serve", *argv]), "argv": argv,
                "snippet": f"serve({recipe_snippet(cfg)}, {recipe_snippet(serve)})", "config": cfg.to_dict(),
                "serve": serve.to_dict(), **left}
    return {"command": recipe_command(cfg), "argv": recipe_argv(cfg), "snippet": recipe_snippet(cfg),
            "config": cfg.to_dict(), **left}


def recipe_text(recipe_record: dict[str, Any]) -> str:
    """recipe.txt: the command line and the snippet of the best confirmed recipe, then each screened win left
    unconfirmed (not in the recipe) with the command that confirms it."""
    text = f"{recipe_record.get('command', '')}\n\n{recipe_record.get('snippet', '')}\n"
    for win in recipe_record.get("unconfirmed") or []:
        text += f"\n# {win['line']}; not in the recipe above. Confirm it (full trials, the quality gate) with:\n"
        text += f"{win['command']}\n"
    return text

"""TuneConfig: the driver's own settings (objective, budget, constraints, exclusions), declared once as options.

The max-qps objective's serve settings (--p99-ms, --batcher-max-batch, --duration, ...) are ServeConfig's own
options, which the tune command takes too (perflab/serve/config.py): TuneConfig.serve holds them. How a trial is
judged (--min-effect-pct, --accept-noisy) is JudgeConfig's (perflab/config.py), shared with `perflab compare`."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from perflab import options
from perflab.config import JudgeConfig, RunConfig
from perflab.errors import PerflabError
from perflab.options import Conflict, option
from perflab.serve.config import ServeConfig
from perflab.tune.objective import unserved_options
from perflab.levers import lever_names
from perflab.quality import precision_tolerance

TUNE = ("tune",)
SEARCH = "tune: search"
CONSTRAINTS = "tune: constraints"
OUTPUT = "tune: output"
QUALITY_LEVELS = ("default", "strict")
THROUGHPUT, MAX_QPS = "throughput", "max-qps"
OBJECTIVES = (THROUGHPUT, MAX_QPS)
STRICT_FACTOR = 0.5  # --quality strict: every tolerance halved
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(s|m|h)?\s*$", re.IGNORECASE)  # a sign, to say "positive"
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_BUDGET_S = 7 * 24 * 3600.0  # a week: longer is a typo (99999999999h), not a search


def parse_duration(text: str) -> float:
    """'90s', '20m', '1h' or a bare number of seconds -> seconds; PerflabError for anything else, <= 0 or over a
    week."""
    match = _DURATION.match(str(text))
    if not match:
        raise PerflabError(f"--budget expects a duration like 90s, 20m or 1h; got {text!r}")
    seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()]
    if seconds <= 0:
        raise PerflabError(f"--budget must be more than zero; got {text!r}")
    if seconds > MAX_BUDGET_S:
        raise PerflabError(f"--budget must be at most 7 days (168h); got {text!r}: give e.g. 20m or 8h")
    return seconds


@dataclass
class TuneConfig(JudgeConfig):
    """How `perflab tune` searches: its budget, the constraints a kept lever must meet, what it may touch; how a
    trial is judged (--min-effect-pct, --accept-noisy) is JudgeConfig's, shared with `perflab compare`."""

    objective: str = option("--objective", str, "what a kept lever must raise. throughput: samples/s of `perflab "
                            "run` (default); max-qps: the highest rate `perflab serve --find-max-qps` holds with p99 "
                            "under --p99-ms MS (required with it; needs --mode infer; serve settings "
                            "--batcher-max-batch, --batch-timeout-ms, --instances, --duration, --min-queries, "
                            "--search-tolerance-pct pass through; run options perflab serve does not take are "
                            "refused; docs/tune.md)", SEARCH, THROUGHPUT,
                            choices=OBJECTIVES, commands=TUNE)
    budget: str = option("--budget", str, "time for the whole search, e.g. 90s, 20m, 1h; every trial's full "
                         "wall time counts, compilation included (default: 20m)", SEARCH, "20m", commands=TUNE,
                         metavar="TIME")
    max_trials: Optional[int] = option("--max-trials", int, "stop after this many trials (default: no limit)",
                                       SEARCH, minimum=1, metavar="N", commands=TUNE)
    tune_batch: bool = option("--tune-batch", bool, "also search the batch size (grow until OOM or no gain, then "
                              "bisect); in training a different batch changes the optimisation", SEARCH, False,
                              commands=TUNE, conflicts=(Conflict("objective", "a serve session's batch is "
                                                                 "--batcher-max-batch; give it instead of "
                                                                 "--tune-batch", value=MAX_QPS),))
    exclude: list = option("--exclude", str, "never try this lever (repeatable; names from `perflab levers`)",
                           SEARCH, [], repeatable=True, metavar="LEVER", commands=TUNE)
    max_p99_ms: Optional[float] = option("--max-p99-ms", float, "reject a lever whose p99 step latency passes this",
                                         CONSTRAINTS, above=0, metavar="MS", commands=TUNE, conflicts=(
                                             Conflict("objective", "with --objective max-qps the latency bound is "
                                                      "--p99-ms (per query); drop --max-p99-ms", value=MAX_QPS),))
    max_memory_gb: Optional[float] = option("--max-memory-gb", float, "reject a lever whose peak memory passes "
                                            "this (GPU peak allocated; on CPU the process's peak RSS)",
                                            CONSTRAINTS, above=0, metavar="GB", commands=TUNE, conflicts=(
                                                Conflict("objective", "perflab serve records no peak memory; drop "
                                                         "--max-memory-gb with --objective max-qps",
                                                         value=MAX_QPS),))
    quality: str = option("--quality", str, "default: the quality gate's tolerances; strict: half of them",
                          CONSTRAINTS, "default", choices=QUALITY_LEVELS, commands=TUNE)
    out: Optional[str] = option("--out", str, "tune directory (default: runs/<timestamp>-<workload>-tune)", OUTPUT,
                                metavar="DIR", commands=TUNE)
    resume: bool = option("--resume", bool, "continue the tune in --out: trials already in tune.jsonl are reused, "
                          "not re-run; given only --out, the recorded start and settings are used", OUTPUT, False,
                          commands=TUNE)
    serve: Optional[ServeConfig] = None  # max-qps: the settings of every serve trial (--find-max-qps is set)

    def validate(self) -> "TuneConfig":
        """Raise PerflabError (one line) for a bad budget, bound, lever name or objective."""
        options.validate(self)
        parse_duration(self.budget)
        check_lever_names(self.exclude)
        if self.objective == MAX_QPS and self.serve is None:
            raise PerflabError(NEEDS_P99)
        if self.objective == THROUGHPUT and self.serve is not None:
            raise PerflabError("serve settings apply to --objective max-qps; add it, or drop them")
        if self.serve is not None:
            self.serve = dataclasses.replace(self.serve, find_max_qps=True).validate()
        return self

    def check_start(self, start: RunConfig, given: Iterable[str] = ()) -> None:
        """The starting run options this objective can measure: max-qps serves inference at --batcher-max-batch,
        and refuses every run option (set in `start`, or `given` by name) that perflab serve does not take, rather
        than leave it out of its trials and its recipe."""
        if self.objective != MAX_QPS:
            return
        if start.mode != "infer":
            raise PerflabError(f"--objective max-qps serves the model and perflab serve measures inference only; "
                               f"--mode {start.mode} cannot be served: add --mode infer")
        if start.batch_size is not None:
            raise PerflabError("--objective max-qps: a serve session's batch is --batcher-max-batch; give it "
                               "instead of --batch")
        unserved = unserved_options(start, given)
        if unserved:
            flags = ", ".join(declared.flag for declared in unserved)
            it = "it" if len(unserved) == 1 else "them"
            raise PerflabError(f"--objective max-qps measures every trial with perflab serve, which does not take "
                               f"{flags}; drop {it} (or tune --objective throughput)")

    @property
    def budget_s(self) -> float:
        return parse_duration(self.budget)

    def to_dict(self) -> dict[str, Any]:
        settings = {name.name: getattr(self, name.name) for name in options.options_of(TuneConfig)}
        return {**settings, "serve": None if self.serve is None else self.serve.to_dict()}


NEEDS_P99 = "--objective max-qps needs --p99-ms MS: the p99 latency bound its max QPS is searched under"


def serve_settings(objective: str, given: dict[str, Any]) -> Optional[ServeConfig]:
    """The serve settings the tune command was given (ServeConfig's options), checked against the objective."""
    if objective != MAX_QPS:
        if given:
            flags = ", ".join(options.option_named(ServeConfig, name).flag for name in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise PerflabError(f"{flags} {verb} to --objective max-qps (the serve objective); add --objective "
                               "max-qps or drop it")
        return None
    if "p99_ms" not in given:
        raise PerflabError(NEEDS_P99)
    return ServeConfig(**given, find_max_qps=True)


def check_lever_names(names: list[str]) -> None:
    """PerflabError listing the valid lever names when one of `names` is not a lever."""
    valid = lever_names()
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise PerflabError(f"--exclude {unknown[0]}: no such lever; valid levers: {', '.join(valid)}")


def strict_tolerances(cfg) -> dict[str, float]:
    """Config changes that halve the quality gate's tolerance for this config's precision (--quality strict)."""
    rtol = precision_tolerance(cfg).rtol * STRICT_FACTOR
    return {"quality_rtol": rtol} if cfg.mode == "infer" else {"quality_loss_rtol": rtol}

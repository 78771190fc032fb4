"""perflab tune: measure, diagnose, try the ranked levers, keep what is proven, until the budget is spent."""
from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from rich.markup import escape

from perflab import options
from perflab.cli import console, err_console
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.report.build import write_report
from perflab.results import read_json_object
from perflab.results.rundir import default_run_dir
from perflab.serve.config import ServeConfig
from perflab.tune import TuneConfig, tune
from perflab.tune.output import TUNE_JSON, objective_figure
from perflab.tune.objective import SERVE
from perflab.tune.rows import TrialRow
from perflab.tune.settings import serve_settings
from perflab.tune.journal import TUNE_JSONL
from perflab.tune.summary import Side, TuneSummary
from perflab.sweep import read_rows
from perflab.report.tune_live import LiveTuneTable


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="diagnose -> try the ranked levers -> keep what is proven, within a time budget",
        description="Start from the given run options: measure, profile and diagnose; screen the levers the "
                    "diagnosis ranks, and the big one-flag levers whatever it says, each with one short trial "
                    "(a compile mode only where the budget left covers its estimated compile time); confirm the "
                    "screened wins, the largest first, with full trials and the quality gate against the best so "
                    "far; keep a lever only when compare accepts it (a significant gain, quality pass) within the "
                    "constraints; re-diagnose and go on until no lever wins or --budget is spent. Trials run in one "
                    "warm worker process (torch imported and the workload built once); a lever that changes the "
                    "process (DataLoader workers, --nproc) gets a process of its own. "
                    "Writes runs/<id>-tune/ with tune.jsonl (one line per trial; --resume reuses them), "
                    "tune.json (the chain of decisions and the recipe) and report.md/report.html. With --objective "
                    "max-qps --p99-ms MS (and --mode infer) each measured trial is `perflab serve --find-max-qps` and "
                    "a lever is kept when its max QPS beats the best's by more than the search's resolution; the "
                    "serve settings below pass through to it. See docs/tune.md.")
    options.add_arguments(parser, RunConfig, "tune")
    options.add_arguments(parser, TuneConfig, "tune")
    options.add_arguments(parser, ServeConfig, "tune")  # the max-qps objective's serve settings
    parser.set_defaults(handler=handle)


def _default_out(workload: str) -> Path:
    base = default_run_dir(workload)
    return base.with_name(base.name + "-tune")


def _recorded_start(out: Path) -> RunConfig:
    """The starting point recorded in a tune directory (for --resume with no run options)."""
    path = out / TUNE_JSONL
    if not path.is_file():
        raise PerflabError(f"--resume: {out} holds no {TUNE_JSONL}; give the directory of an earlier tune")
    rows = [TrialRow.from_dict(row) for row in read_rows(path)]
    if not rows:
        raise PerflabError(f"--resume: {path} is empty; start the tune again without --resume")
    return RunConfig.from_dict(rows[0].config)


def _recorded_settings(out: Path) -> Optional[TuneConfig]:
    """The tune settings an earlier tune in `out` recorded in tune.json (objective, budget, serve settings, ...),
    for --resume given nothing else; None when it wrote none. A journal of serve trials without them is refused:
    resuming it with the default objective would mix two searches in one directory."""
    path = out / TUNE_JSON
    if path.is_file():
        recorded = TuneSummary.from_dict(read_json_object(path, "a perflab tune record",
                                                          "give the tune's options again")).settings
        if recorded:
            serve = recorded.pop("serve", None)
            known = {declared.name for declared in options.options_of(TuneConfig)}
            return TuneConfig(**{k: v for k, v in recorded.items() if k in known},
                              serve=ServeConfig(**serve) if serve else None)
    journal = out / TUNE_JSONL
    if journal.is_file() and any(TrialRow.from_dict(row).kind == SERVE for row in read_rows(journal)):
        raise PerflabError(f"--resume: {out} holds a max-qps tune but no tune.json with its settings; give its "
                           "options again (--objective max-qps --p99-ms MS ...) with --resume")
    return None


def handle(args: argparse.Namespace) -> int:
    changes = options.changes_from_args(TuneConfig, args, "tune")
    serve_given = options.changes_from_args(ServeConfig, args, "tune")
    serve = serve_settings(changes.get("objective", TuneConfig.objective), serve_given)
    settings = TuneConfig(**changes, serve=serve).validate()
    run_changes = options.changes_from_args(RunConfig, args, "tune")
    if settings.resume and settings.out and not run_changes and not serve_given and set(changes) <= {"resume", "out"}:
        recorded = _recorded_settings(Path(settings.out))  # --resume --out DIR alone: the tune as it was started
        if recorded is not None:
            settings = replace(recorded, resume=True, out=settings.out).validate()
    if settings.resume and not run_changes:
        if not settings.out:
            raise PerflabError("--resume needs --out DIR: the directory of the tune to continue")
        start = _recorded_start(Path(settings.out))
        settings.check_start(start)
    else:
        start = RunConfig(**run_changes)
        settings.check_start(start, given=run_changes)  # before validation: a refusal names what serve cannot take
        start.validate()
    out = Path(settings.out) if settings.out else _default_out(start.workload)
    command = ["perflab"] + args.argv

    began = time.perf_counter()
    try:
        with LiveTuneTable(console, settings.objective) as table:
            summary = tune(start, settings, out, observer=table, command=command, report=write_report)
    except KeyboardInterrupt:
        resume = command if "--resume" in command else command + ["--resume"]
        if "--out" not in resume:
            resume += ["--out", str(out)]
        err_console.print(f"[yellow]interrupted[/]: every finished trial is saved in {escape(str(out / TUNE_JSONL))}; "
                          f"continue with:\n  {escape(shlex.join(resume))}", highlight=False, soft_wrap=True)
        return 130
    record = TuneSummary.from_dict(summary)
    _print_summary(record, out, time.perf_counter() - began)
    if record.not_judged:  # the last line: what the verdicts above could not rest on
        console.print(f"[yellow]not judged[/]: {escape(record.not_judged)}", highlight=False, soft_wrap=True)
        return 1 if settings.fail_on_not_judged else 0
    return 0


def _kept(summary: TuneSummary) -> str:
    """The kept levers (or 'nothing'), then each screened win left unconfirmed."""
    unconfirmed = [win.recipe_line() for win in summary.recipe.unconfirmed]
    return "; ".join([", ".join(summary.kept) or "nothing", *unconfirmed])


def _print_summary(summary: TuneSummary, out: Path, elapsed_s: float) -> None:
    start, best = summary.start or Side(), summary.best or Side()
    speedup = summary.speedup
    objective = summary.objective
    key, unit = objective_figure(objective.name)
    bound = f" at p99 ≤ {objective.p99_ms:g} ms" if objective.p99_ms is not None else ""
    console.print(f"[bold]{start.figure(key) or 0:,.1f} → {best.figure(key) or 0:,.1f} {unit}{bound}"
                  + (f" ({speedup:.2f}×)" if speedup else "") + "[/]"
                  f"; kept: {escape(_kept(summary))}", highlight=False)
    console.print(f"stopped: {escape(summary.stop_reason)}; {summary.trials} trials, "
                  f"{summary.spent_s:.0f} s of trials ({elapsed_s:.0f} s in all)", highlight=False)
    for note in summary.notes:
        console.print(f"[yellow]note[/]: {escape(note)}", highlight=False)
    console.print("recipe:\n  " + escape(summary.recipe.command) + "\n  " + escape(summary.recipe.snippet),
                  highlight=False, soft_wrap=True)
    for win in summary.recipe.unconfirmed:
        console.print(f"[yellow]{escape(win.recipe_line())}[/]; confirm it with:\n  {escape(win.command)}",
                      highlight=False, soft_wrap=True)
    console.print(f"saved {escape(str(out / TUNE_JSON))}, report {escape(str(out / 'report.html'))}", highlight=False)

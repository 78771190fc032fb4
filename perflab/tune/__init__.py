"""perflab tune: diagnose, try the ranked levers, keep what compare and the quality gate prove, repeat.

Layout of a tune directory (`runs/<id>-tune/`):

    tune.jsonl          one line per finished trial (fsynced at once): its config, figures and decision
    tune.json           the chain of decisions, why the search stopped, the recipe (rewritten at the end)
    trials/NN-<lever>/  each trial's run folder (result.json; trace.json for profiles)
    trials/NN-<lever>.log  what the trial's process printed
    report.md/.html     the chain, a waterfall of the gains, the breakdown before and after

Modules: settings (TuneConfig, --budget parsing), budget (spent, left, held back for a confirmation), screening (the
two stages of a round: a short screen of every candidate, full trials only for the screened wins, the largest first),
confirmation (a confirmation sized to the budget left), candidates (what to try and with which values; compile
modes' estimated cost), ordering (tune's order of the proposals: cheap and paired levers first), retry (one
more try for a lever inside the noise against a large prediction), trial (one trial's process, classified), warm
and worker (the default runner: most trials in one warm worker process), record (one trial run or
reused, its row and its journal line), rows (a trial's row, typed: TrialRow, its decision and its memory trade),
journal (tune.jsonl), decision (keep or reject), objective (--objective max-qps: serve trials judged by max QPS), stop
(why the search stopped, and the stop line), limits (the budget and --max-trials: may another trial start),
search_state (the start, the best so far, and what became of each lever), start (the starting point's trial, read),
profiling (the profile-and-diagnose step of a round), candidate_trials (a candidate's trial against the best, kept
when it wins), driver (the loop), summary (tune.json, typed: the chain, the screens, the diagnoses; read back
through perflab/results/records.py, tolerating keys an older file lacks), output (tune.json from a Tuner), recipe
(the tuned command line and RunConfig, and the screened wins left unconfirmed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Union

from perflab.config import RunConfig
from perflab.results.rundir import locked_out
from perflab.tune.driver import Tuner, TuneObserver
from perflab.tune.output import TUNE_JSON, tune_summary, write_tune_json
from perflab.tune.settings import TuneConfig, parse_duration
from perflab.tune.stop import StopKind, StopReason
from perflab.tune.warm import WarmRunner

INTERRUPTED = "interrupted"
IN_PROGRESS = "in progress (tune.json is rewritten after every trial)"


def tune(start: RunConfig, settings: TuneConfig, out: Union[str, Path], observer: Optional[TuneObserver] = None,
         command: Optional[list[str]] = None, report: Optional[Callable[[Path], list[Path]]] = None,
         **tuner_options: Any) -> dict[str, Any]:
    """Tune from `start` into `out`; returns the tune.json summary. On KeyboardInterrupt, tune.json is written
    for what finished and the interrupt propagates (resume with settings.resume=True). `report` writes the
    report into the folder at the end (the CLI passes perflab.report.build.write_report), inside the budget."""
    # one writer per tune folder, named by its absolute path (see out_path); its warm worker ends with it
    with locked_out(Path(out)) as folder, WarmRunner() as warm:
        tuner = Tuner(start, settings, folder, observer=observer, **{"runner": warm, **tuner_options})
        # tune.json holds the best confirmed recipe at any moment: rewritten after every trial, and on Ctrl-C
        tuner.recorder.on_record = lambda: write_tune_json(tuner.out, tune_summary(tuner, IN_PROGRESS, command or []))
        try:
            stop_reason = tuner.run()
        except KeyboardInterrupt:
            tuner.adopt_recorded_start()
            if tuner.state.best_row is not None:
                interrupted = StopReason(StopKind.INTERRUPTED)
                write_tune_json(tuner.out, tune_summary(tuner, tuner.stop_line(interrupted), command or [], interrupted))
            raise
        summary = tune_summary(tuner, stop_reason, command or [], tuner.stopped)
        write_tune_json(tuner.out, summary)
        record = summary.to_dict()  # what tune.json holds, and the report's files beside it
        if report is not None:
            record.update(report=[str(path) for path in report(tuner.out)])
        return record

__all__ = ["tune", "Tuner", "TuneObserver", "TuneConfig", "parse_duration", "TUNE_JSON"]

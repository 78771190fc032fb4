"""One trial of a tune, recorded: run it (or reuse its row from tune.jsonl), build its row, judge it, write it.

Every trial is one row of tune.jsonl written before the next begins; on --resume the recorded row is reused
(nothing is run twice), and either way the budget is charged its wall time once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.results import Result
from perflab.serve.config import ServeConfig
from perflab.tune.budget import MIN_TRIAL_LEFT_S, Budget
from perflab.tune.decision import Decision, not_measured
from perflab.tune.journal import Journal, trial_key
from perflab.tune.objective import SERVE
from perflab.tune.rows import TrialRow
from perflab.tune.trial import OK, QUALITY_FAIL, TrialOutcome, trial_figures

TRIALS_DIR = "trials"
SCREEN = "screen"  # the stage of a screening trial (tune.jsonl's "stage")
CONFIRM = "confirm"  # the stage of a confirmation of a screened win

Runner = Callable[..., TrialOutcome]  # (cfg, kind, out[, time_limit_s=][, serve=]) -> outcome
Judge = Callable[[Result, TrialOutcome], Decision]


def gain_pct(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    """The change of `value` over `reference`, in %; None without both."""
    if value is None or not reference:
        return None
    return 100 * (value / reference - 1)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text)


@dataclass
class TrialRequest:
    """A trial to record: what runs, under which label, what tune.jsonl says of it, and what it is judged against."""

    cfg: RunConfig
    kind: str  # run | profile | serve
    label: str
    context: dict[str, Any] = field(default_factory=dict)
    judge_against: Optional[Result] = None
    time_limit_s: Optional[float] = None
    serve_cfg: Optional[ServeConfig] = None  # a serve trial's settings


@dataclass
class TrialRecord:
    """A recorded trial: its tune.jsonl row, its result (None when nothing was measured), and whether it was reused."""

    row: TrialRow
    result: Optional[Result]
    reused: bool

    @property
    def status(self) -> str:
        return self.row.status

    @property
    def kept(self) -> bool:
        return self.row.kept


class TrialRecorder:
    """Runs and records the trials of one tune directory, numbering them in order."""

    def __init__(self, out: Path, journal: Journal, budget: Budget, runner: Runner, observer: Any, judge: Judge):
        self.out, self.journal, self.budget = out, journal, budget
        self.runner, self.observer, self.judge = runner, observer, judge
        self.count = 0  # trials recorded (or reused) so far: the next one's number
        self.on_record: Optional[Callable[[], None]] = None  # after every fresh trial (tune.json is rewritten)

    def record(self, request: TrialRequest) -> TrialRecord:
        """Run (or reuse) one trial; write its row, with its decision, before returning."""
        key = trial_key(request.cfg, request.kind, request.serve_cfg if request.kind == SERVE else None)
        row = self.journal.get(key)
        record = self._run(key, request) if row is None else TrialRecord(row, self._load(row), reused=True)
        self.budget.charge(key, record.row.wall_s)
        self.count += 1
        self.observer.trial_finished(record.row, record.reused)
        if not record.reused and self.on_record is not None:
            self.on_record()  # tune.json (the best confirmed recipe) is current after every trial
        return record

    def _run(self, key: str, request: TrialRequest) -> TrialRecord:
        name = f"{self.count:02d}-{_slug(request.label)}"
        self.observer.trial_started(name, request.kind)
        limit: dict[str, Any] = {}
        if request.time_limit_s is not None:
            limit.update(time_limit_s=max(MIN_TRIAL_LEFT_S, request.time_limit_s))
        if request.kind == SERVE:
            limit.update(serve=request.serve_cfg)
        with self.budget.running_trial():
            outcome = self.runner(request.cfg, request.kind, self.out / TRIALS_DIR / name, **limit)
        row = self._row(key, name, request, outcome)
        self.journal.append(row)
        return TrialRecord(row, outcome.result, reused=False)

    def _row(self, key: str, name: str, request: TrialRequest, outcome: TrialOutcome) -> TrialRow:
        # the figures and the context are named as tune.jsonl names them: the row takes them by those names
        row = TrialRow.from_dict({**trial_figures(outcome), **request.context})
        row.index, row.key, row.name, row.kind, row.label = self.count, key, name, request.kind, request.label
        row.dir, row.status, row.reason = f"{TRIALS_DIR}/{name}", outcome.status, outcome.reason
        row.wall_s, row.config, row.created_unix = round(outcome.wall_s, 3), request.cfg.to_dict(), time.time()
        if row.stage == SCREEN and row.reference_throughput:
            row.screened_gain_pct = gain_pct(row.throughput, row.reference_throughput)
        if request.judge_against is not None:
            decision = (self.judge(request.judge_against, outcome) if outcome.result is not None
                        else not_measured(outcome.status, outcome.reason))
            row.decision, row.measured_gain_pct = decision, decision.gain_pct
        return row

    def _load(self, row: TrialRow) -> Optional[Result]:
        path = self.out / row.dir / "result.json"
        if row.status not in (OK, QUALITY_FAIL):
            return None
        if not path.is_file():
            raise PerflabError(f"{path} is missing but tune.jsonl records it; restore it or start a new tune")
        return Result.load(path)

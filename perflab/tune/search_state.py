"""What a tune's search knows between trials: the start, the best so far, and what became of each lever.

One mutable record shared by the loop (perflab/tune/driver.py), the trial of a candidate (candidate_trials.py) and
the two-stage round (screening.py); tune.json (output.py) is written from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from perflab.config import RunConfig
from perflab.results import Result
from perflab.serve.config import ServeConfig
from perflab.tune.recipe import UnconfirmedWin
from perflab.tune.record import TrialRecord
from perflab.tune.rows import TrialRow


@dataclass
class SearchState:
    """The start and the best so far, every judged trial, and the levers lost, settled or refused."""

    start: RunConfig  # resolved (device, batch) by the start trial's own process once it ran
    best_cfg: RunConfig
    # --objective max-qps: the serve settings of the best trial (the batching policy tune may change, once no model
    # lever is left, as the best trial's own inference-queue diagnosis proposes)
    serve_cfg: Optional[ServeConfig] = None
    best: Optional[Result] = None
    best_row: Optional[TrialRow] = None
    baseline_row: Optional[TrialRow] = None
    chain: list[TrialRow] = field(default_factory=list)  # every judged trial, in order
    lost: list[str] = field(default_factory=list)  # levers tried that never won (the diagnosis is told)
    settled: set[str] = field(default_factory=set)  # levers whose search is over, won or lost
    skipped: dict[str, str] = field(default_factory=dict)  # label -> why it was not tried
    notes: list[str] = field(default_factory=list)
    unconfirmed: list[UnconfirmedWin] = field(default_factory=list)  # screened wins the budget left no room to confirm

    def started(self, start: RunConfig, record: TrialRecord) -> None:
        """The start's trial ran: its resolved config is the start, the first best and the baseline."""
        self.start = self.best_cfg = start
        self.best, self.best_row, self.baseline_row = record.result, record.row, record.row

    def keep(self, cfg: RunConfig, record: TrialRecord) -> None:
        """A trial of `cfg` won: it is the best now."""
        self.best_cfg = cfg
        self.best, self.best_row = record.result, record.row

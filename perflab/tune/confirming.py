"""The second stage of a round: a screened win confirmed by full trials and the quality gate, or left unconfirmed.

    confirm = the win's candidate, every --trials (fewer, shorter ones where the budget left cannot hold all:
              perflab/tune/confirmation.py sizes it), the quality gate, judged by compare against the best so far;
              kept only when compare accepts it. Unjudged for its own candidate's noise alone (compare's noisy_sides),
              it runs once more with trials LONGER_TRIALS times as long where the budget holds that; a win that
              cannot be confirmed stays "screened, not confirmed" in the recipe, with the command that confirms it.

The first stage (perflab/tune/screening.py) hands each win here as a Screened and reads back whether it was kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from perflab.config import RunConfig
from perflab.tune import candidates as search
from perflab.tune.candidate_trials import CandidateTrials
from perflab.tune.confirmation import (LONGER_TRIALS, SCREEN_MIN_TRIAL_S, ConfirmationCost, ConfirmationSize,
                                       cached_compile_saving_s, candidate_alone_unsteady, gate_s,
                                       longer_confirmation_s, size_confirmation)
from perflab.tune.limits import TrialLimits
from perflab.tune.recipe import UnconfirmedWin, recipe_command
from perflab.tune.record import CONFIRM
from perflab.tune.rows import TrialRow
from perflab.tune.stop import StopReason
from perflab.tune.summary import ScreenEntry


@dataclass
class Screened:
    """One candidate's screen: its trial row and gain over the round's reference, and what became of it."""

    candidate: search.Candidate
    row: TrialRow
    gain_pct: Optional[float]
    win: bool
    outcome: str = ""  # confirmed | rejected at confirmation: why | not confirmed: budget | no win

    def entry(self) -> ScreenEntry:
        """What tune.json's "screened" says of it."""
        return ScreenEntry(self.candidate.label, self.candidate.lever, self.row.name, self.row.status, self.gain_pct,
                           self.win, self.outcome, self.row.wall_s, self.row.compile_s)


@dataclass(frozen=True)
class Confirmed:
    """What a confirmation came to: kept or not, and the limit (--max-trials) that refused it, if one did."""

    kept: bool
    stop: Optional[StopReason] = None


class Confirmer:
    """Confirms screened wins through `trials` (against the best in trials.state), within `limits`; `reference_s`
    is what the round's reference trial takes again (the screening stage knows it)."""

    def __init__(self, trials: CandidateTrials, limits: TrialLimits, reference_s: Callable[[], float]):
        self.trials, self.limits, self.reference_s = trials, limits, reference_s
        self.state, self.budget = trials.state, trials.budget

    def confirm(self, screened: Screened) -> Confirmed:
        """A full trial with the quality gate (fewer, shorter ones where the budget left cannot hold all), judged
        against the best so far."""
        candidate = screened.candidate
        if not self.trials.can_try(candidate, estimate_cost=False):
            screened.outcome = f"not confirmed: {self.state.skipped.get(candidate.label, 'not applicable any more')}"
            return Confirmed(False)
        stop = self.limits.reason()
        if stop is not None:  # --max-trials reached: the win stays screened, never kept unconfirmed
            self._leave_unconfirmed(screened, f"not confirmed: {stop.text()}")
            return Confirmed(False, stop)
        cost = self.cost(screened)
        size = size_confirmation(cost, self.budget.left_s())
        if size is None:
            shortest = cost.expected_s(min(2, cost.full_trials), min(cost.full_min_trial_s, SCREEN_MIN_TRIAL_S))
            self._leave_unconfirmed(screened, f"not confirmed: budget (a confirmation needs about {shortest:.0f} s "
                                              f"even with fewer, shorter trials; "
                                              f"{max(0.0, self.budget.left_s()):.0f} s left)")
            return Confirmed(False)
        return Confirmed(self._run(screened, size))

    def reserve_s(self, pending: list[Screened]) -> float:
        """What confirming the largest win waiting will take (sized to the budget left): screening more must leave
        it. A win that cannot be confirmed even with fewer, shorter trials holds nothing back."""
        left_s = self.budget.left_s()
        for win in sorted(pending, key=lambda s: s.gain_pct or 0.0, reverse=True):
            size = size_confirmation(self.cost(win), left_s)
            if size is not None:
                return size.expected_s
        return 0.0

    def cost(self, screened: Screened) -> ConfirmationCost:
        """The screen's wall time plus the trials beyond its one and what a full trial of the best added beyond its
        own trials (the quality gate)."""
        cfg, best = self.state.best_cfg, self.state.best_row
        screen_min_trial_s = min(cfg.min_trial_s, SCREEN_MIN_TRIAL_S)
        # the best's full trial less the worker's start it paid: the start's trial starts the worker (an H100's
        # elementwise chain: a 12.8-s start with the worker's start, torch and CUDA in it; its confirmation 1.8 s)
        gate = gate_s(best.wall_s - (best.setup_s or 0.0), self.reference_s(), _steps_s(cfg, best.throughput),
                      cfg.trials, cfg.min_trial_s, screen_min_trial_s)
        # compile_s is the first step's time, which also holds a CUDA graph's capture: only a compiled candidate's
        # is found again in the caches
        compiled = self.trials.candidate_config(screened.candidate).compile
        saving = cached_compile_saving_s(screened.row.compile_s) if compiled else 0.0
        return ConfirmationCost(screened.row.wall_s, screen_min_trial_s,
                                _steps_s(cfg, screened.row.throughput), gate, cfg.trials, cfg.min_trial_s, saving)

    def _run(self, screened: Screened, size: ConfirmationSize) -> bool:
        candidate = screened.candidate
        extra = {"stage": CONFIRM, "screened_gain_pct": screened.gain_pct, "screen_trial": screened.row.name,
                 "confirmation": size.to_dict()}
        shorter = None if size.full else (size.trials, size.min_trial_s)
        if not size.full:
            self.trials.observer.note(f"{candidate.label}: confirmed with {size.describe()}")
        kept = self.trials.try_candidate(candidate, extra, shorter)
        row = self.state.chain[-1]
        sized = "" if size.full else f" ({size.describe()})"
        if not kept and row.measured and candidate_alone_unsteady(row.decision):
            longer_s = longer_confirmation_s(self.cost(screened), size)
            if longer_s <= self.budget.left_s():
                self.trials.observer.note(f"{candidate.label}: not judged ({row.decision.noisy[0]}); confirmed once "
                                          f"more with trials {LONGER_TRIALS:g}x as long")
                kept = self.trials.try_candidate(candidate, {**extra, "longer_trials": LONGER_TRIALS}, shorter,
                                                 longer=LONGER_TRIALS)
                row = self.state.chain[-1]
                sized += f" (again with trials {LONGER_TRIALS:g}x as long: the first one's candidate was not steady)"
        self.state.settled.add(candidate.lever)
        if kept:
            screened.outcome = f"confirmed: kept{sized}"
            return True
        screened.outcome = f"not confirmed: {(row.decision.why if row.decision else '') or row.status}{sized}"
        if not row.measured:  # stopped or crashed: the win stands, unconfirmed
            self._leave_unconfirmed(screened, screened.outcome)
        elif row.judged and candidate.lever not in self.state.lost:
            self.state.lost.append(candidate.lever)
        return False

    def _leave_unconfirmed(self, screened: Screened, outcome: str) -> None:
        """The win stays screened, never kept: said in the stop line and put in the recipe with its command."""
        screened.outcome = outcome
        command = recipe_command(self.trials.trial_config(self.trials.candidate_config(screened.candidate)))
        self.state.unconfirmed.append(UnconfirmedWin(screened.candidate.label, screened.gain_pct, outcome, command))


def _steps_s(cfg: RunConfig, throughput: Optional[float]) -> float:
    """The timed steps of one trial of `cfg` at `throughput` samples/s (0 without a figure)."""
    if not throughput or not cfg.batch_size:
        return 0.0
    return cfg.steps * cfg.batch_size / throughput

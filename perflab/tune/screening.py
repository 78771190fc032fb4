"""Two stages per round: screen every candidate with one short trial, confirm only the ones that screened as a win.

    reference = one short trial of the best so far (the yardstick every screen of the round is read against)
    screen    = best + one lever, one trial (--trials 1, a short --min-trial-s), no quality gate
                -> a win when it beats the reference by SCREEN_WIN_PCT (or twice --min-effect-pct) or more
    confirm   = the screened wins, largest screened gain first, each a full trial (every --trials, the quality
                gate) judged by compare against the best so far; only a confirmed win is kept. The winner first:
                a win larger than any candidate left to screen could give (its predicted gain) is confirmed at
                once, before the smaller candidates are screened; a confirmation the budget left cannot hold in
                full runs fewer, shorter trials (perflab/tune/confirmation.py) rather than none; the stage
                itself is perflab/tune/confirming.py

Successive halving with two rungs: every candidate gets the cheap rung, only winners the expensive one. The
order of the screens is perflab/tune/screen_order.py's: the big one-flag levers first (INSURANCE), named or not;
when none of the round's candidates wins, every other lever is screened too (WIDER_SOURCE). A screen that did not
win is a loss (the diagnosis is told); a win the budget left no room to confirm is reported as such (with the
command that confirms it), never kept.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Protocol

from perflab.config import RunConfig
from perflab.tune import candidates as search
from perflab.tune import ordering
from perflab.tune.screen_order import WIDER_SOURCE, expected_gain_pct, screening_order
from perflab.tune.candidate_trials import CandidateTrials
from perflab.tune.confirmation import SCREEN_MIN_TRIAL_S, cached_compile_saving_s
from perflab.tune.confirming import Confirmer, Screened
from perflab.tune.limits import TrialLimits
from perflab.tune.record import SCREEN, TrialRequest, gain_pct
from perflab.tune.rows import TrialRow
from perflab.tune.stop import StopKind, StopReason
from perflab.tune.summary import ScreenEntry
from perflab.tune.trial import OK, lengthened

SCREEN_MARGIN_S = 2.0  # a screen stops this much short of the time held for a confirmation ...
SCREEN_MARGIN_SHARE = 0.02  # ... or this share of the budget, whichever is less
SCREEN_WIN_PCT = 5.0  # a single trial's gain must pass this (or 2 x --min-effect-pct) to be confirmed


def screen_config(cfg: RunConfig, scale: float = 1.0) -> RunConfig:
    """One short trial of `cfg`, without the quality gate: what a screen (and a round's reference) measures; with
    `scale`, that trial `scale` times as long (its steps and --min-trial-s: the steadier pass)."""
    return lengthened(cfg.replace(trials=1, check_quality=False,
                                  min_trial_s=min(cfg.min_trial_s, SCREEN_MIN_TRIAL_S)), scale)


def win_threshold_pct(min_effect_pct: float) -> float:
    """The screened gain a candidate needs before it is confirmed (one trial: a margin over the noise)."""
    return max(SCREEN_WIN_PCT, 2 * min_effect_pct)


def start_noise_pct(start: TrialRow, references: list[TrialRow]) -> Optional[float]:
    """How much the starting point's own throughput moves, in %: the larger of its trials' 95% CI half-width and
    how far any screens' reference trial of it lies from it; None without a figure. A planted nonzero router on an
    H200 measured 4,842-5,722 samples/s (+-8.6%) for its start and 5,560 for the reference: a +5% screen cannot
    tell a lever from that."""
    value = start.throughput
    if not value:
        return None
    spreads = []
    low, high = (start.throughput_ci95 or [None, None])[:2]
    if low is not None and high is not None:
        spreads.append(100 * (high - low) / 2 / value)
    spreads += [100 * abs(row.throughput / value - 1) for row in references if row.throughput]
    return max(spreads) if spreads else None


class RoundSource(Protocol):
    """What a round reads of the profile step (perflab/tune/profiling.py Profiler)."""

    last_profile_s: Optional[float]  # a profile is one short trial too: what a reference is expected to take

    def proposals(self) -> list[search.Proposal]:
        """The levers this round proposes."""


class Screener:
    """The two-stage round of a Tuner: screens, then confirmations; records every screen for tune.json. Its
    candidates run through `trials` (against the best in trials.state), within `limits`."""

    def __init__(self, trials: CandidateTrials, limits: TrialLimits, source: RoundSource, cpu_count: int):
        self.trials, self.limits, self.source, self.cpu_count = trials, limits, source, cpu_count
        self.state, self.settings, self.levers = trials.state, trials.settings, trials.levers
        self.budget = trials.budget
        self.screens: list[Screened] = []  # every screen of the tune, in order
        self.reference: Optional[TrialRow] = None  # the row of the round's reference trial
        self.references: list[TrialRow] = []  # every round's measured reference (the noise of the best)
        self.out_of_budget: Optional[StopReason] = None  # why no further screen fits in the budget left
        self.pending: list[Screened] = []  # this round's wins waiting for their confirmation
        self.round_wins: list[Screened] = []  # every win screened this round
        self.confirmer = Confirmer(trials, limits, self._reference_s)
        self.trial_scale = 1.0  # a screen's trial is this many times the usual short one (lengthen())

    # ---------------------------------------------------------------------------------------- one round

    def round(self) -> bool:
        """Screen this round's candidates (a decisive win is confirmed at once), then confirm the other wins;
        True when one was kept."""
        arranged = screening_order(self.source.proposals(), self.levers, self.state.best_cfg)
        self.reference, self.out_of_budget, self.pending, self.round_wins = None, None, [], []
        kept_any = self._screen_all(arranged)
        if not self.round_wins and not self.out_of_budget:  # nothing the diagnosis pointed at won: every other lever
            kept_any = self._screen_all(self._wider(arranged))
        kept_any = self._confirm_pending() or kept_any
        self.budget.hold(0.0)
        if self.out_of_budget and not kept_any:
            self.limits.stop(self.out_of_budget)  # the screens the budget could not hold: spent, not "nothing won"
        return kept_any

    def _screen_all(self, arranged: list[search.Proposal]) -> bool:
        """Screen each proposal in turn; True once a decisive win (the winner first) was confirmed and kept: the
        round's other candidates are then screened after the re-profile, against the new best."""
        for index, proposal in enumerate(arranged):
            if self.out_of_budget:
                break  # the wins screened so far still go to confirmation (or are reported unconfirmed)
            if proposal.lever in self.state.settled or proposal.lever in self.settings.exclude:
                continue
            wins = self._screen_lever(search.expand(proposal, self.levers[proposal.lever], self.state.best_cfg,
                                                    self.cpu_count))
            self.pending += wins
            self.round_wins += wins
            winner = self._decisive(arranged[index + 1:])
            if winner is not None and self._confirm_win(winner):
                return True
        return False

    def _decisive(self, remaining: list[search.Proposal]) -> Optional[Screened]:
        """The largest win waiting, when it is larger than any candidate left to screen is predicted to give."""
        if not self.pending:
            return None
        winner = max(self.pending, key=lambda s: s.gain_pct or 0.0)
        left = [expected_gain_pct(p) for p in remaining if p.lever not in self.state.settled and p.lever not in
                self.settings.exclude and p.lever != winner.candidate.lever]
        return winner if (winner.gain_pct or 0.0) > max(left, default=float("-inf")) else None

    def _confirm_pending(self) -> bool:
        """Confirm the round's waiting wins, largest screened gain first; True when one was kept."""
        kept_any = False
        for screened in sorted(self.pending, key=lambda s: -(s.gain_pct or 0.0)):
            if screened.outcome:  # settled already this round (a partner confirmed at once, a lever kept)
                continue
            kept_any = self._confirm_win(screened) or kept_any
        self.pending = []
        return kept_any

    def _confirm_win(self, screened: Screened) -> bool:
        """Confirm one win; when kept, its lever's other screened values are moot and its partner comes next."""
        if screened in self.pending:
            self.pending.remove(screened)
        if not self._confirm(screened):
            return False
        for other in self.round_wins:  # one value per lever is kept; its other screened values are moot now
            if other is not screened and other.candidate.lever == screened.candidate.lever:
                other.outcome = other.outcome or f"not confirmed: {screened.candidate.label} was kept"
        self._partner(screened.candidate.lever)
        return True

    def _wider(self, arranged: list[search.Proposal]) -> list[search.Proposal]:
        """Every lever the round did not propose, in tune's order: a diagnosis names what it can see (a sync the
        user must remove), not every lever that pays (the fused optimizer gave 1.38x on the planted nonzero router,
        where tune had stopped with 'no lever won' after 76 s of a 180-s budget)."""
        proposed = {p.lever for p in arranged}
        return ordering.arrange([search.Proposal(name, WIDER_SOURCE, None, None, named=False)
                                 for name in self.levers if name not in proposed], self.state.best_cfg)

    # ---------------------------------------------------------------------------------------- screens

    def _reference(self) -> TrialRow:
        """One short trial of the best so far: screens are read against it (same length, same conditions). If it
        did not measure, the best's own full trial is the yardstick."""
        self.limits.check()
        best = self.state.best_row
        record = self.trials.record(TrialRequest(screen_config(self.state.best_cfg, self.trial_scale),
                                                 self.trials.measure,
                                                 f"screen-{best.label}", {"stage": SCREEN, "reference": True},
                                                 time_limit_s=self.budget.left_s()))
        if record.status != OK or not record.row.throughput:
            return dataclasses.replace(best, wall_s=record.row.wall_s)
        self.references.append(record.row)
        return record.row

    def _screen_lever(self, candidates: list[search.Candidate]) -> list[Screened]:
        """Screen a lever's values (a ladder climbs while it pays, patience LADDER_PATIENCE); its wins."""
        results: list[Screened] = []
        misses, best_gain = 0, None
        for candidate in candidates:
            if not self.trials.can_try(candidate, estimate_cost=False):
                continue
            screened = self.screen(candidate)
            if screened is None:
                break  # no room left in the budget for this screen
            results.append(screened)
            gain = screened.gain_pct
            improved = screened.win and (best_gain is None or (gain or 0) > best_gain)
            best_gain = max(best_gain or 0.0, gain or 0.0) if screened.win else best_gain
            misses = 0 if improved else misses + 1
            if candidate.search == search.ONCE or (candidate.search == search.LADDER
                                                   and misses >= search.LADDER_PATIENCE):
                break
        if results:
            self._settle(candidates[0].lever, results)
        return [s for s in results if s.win]

    def _settle(self, lever: str, results: list[Screened]) -> None:
        """A lever screened and lost is told to the diagnosis (not proposed again); one refused or crashed every
        time is settled without a loss (nothing was measured)."""
        measured = [s for s in results if s.row.status == OK]
        if measured and not any(s.win for s in results):
            self.state.settled.add(lever)
            self.state.lost.append(lever)
        elif not measured:
            self.state.settled.add(lever)

    def screen(self, candidate: search.Candidate) -> Optional[Screened]:
        """One short trial of best + candidate; None (and a skipped entry) when the budget left cannot hold it."""
        self.out_of_budget = self.limits.reason()  # --max-trials counts screens too
        if self.out_of_budget is not None or not self._has_reference():
            return None
        expected_s = self._expected_screen_s(candidate)
        if expected_s is None:  # a compile mode whose cost scales compile=default's, which did not finish
            self.state.skipped.setdefault(candidate.label, "not screened: its compile time is unknown (compile="
                                                           "default, whose compile time it is estimated from, did not "
                                                           "finish)")
            return None
        self.budget.hold(self.confirmer.reserve_s(self.pending))
        free_s = self.budget.free_s()
        if expected_s > free_s:
            self._no_room(candidate, expected_s, free_s)
            return None
        self.out_of_budget = self.limits.reason()  # spent: end this round's screens, confirm what won so far
        if self.out_of_budget:
            return None
        return self._measure_screen(candidate, expected_s, free_s)

    def _has_reference(self) -> bool:
        """Measure the round's reference before its first screen; False when not even that fits."""
        if self.reference is not None:
            return True
        expected_s = self.source.last_profile_s or 0.0  # a profile is one short trial too
        if expected_s > self.budget.left_s():
            self.out_of_budget = StopReason(StopKind.BUDGET_SPENT, f"{self.budget.spent_line()} (less left than a "
                                                                   f"short trial takes, about {expected_s:.0f} s)")
            return False
        self.reference = self._reference()
        return True

    def _no_room(self, candidate: search.Candidate, expected_s: float, free_s: float) -> None:
        """A screen that does not fit beside the confirmation held: skipped; unless it is a compile mode (costlier
        than a plain screen), the budget is spent for screens."""
        self.state.skipped.setdefault(candidate.label, f"not screened: needs about {expected_s:.0f} s and "
                                                        f"{free_s:.0f} s of the budget is left (after the confirmation "
                                                        "of the best win screened so far)")
        if not search.compiles(self.levers.get(candidate.lever)):  # not even a plain screen fits: spent
            self.out_of_budget = StopReason(StopKind.BUDGET_SPENT, f"{self.budget.spent_line()} ({free_s:.0f} s "
                                                                   f"left, less than a screen takes, about "
                                                                   f"{expected_s:.0f} s)")

    def _measure_screen(self, candidate: search.Candidate, expected_s: float, free_s: float) -> Screened:
        context = self.trials.context(candidate)
        context.update(stage=SCREEN, against=self.reference.name, reference_throughput=self.reference.throughput)
        # a screen may not eat the time held for confirming the best win so far (compile=default's first screen is
        # its own compile-time measurement and runs until this limit); it stops a margin short of it, so that the
        # time tune itself spends around a trial does not leave the held confirmation a moment too short
        limit_s = max(expected_s, free_s - min(SCREEN_MARGIN_S, self.budget.share_s(SCREEN_MARGIN_SHARE)))
        record = self.trials.record(TrialRequest(screen_config(self.trials.candidate_config(candidate),
                                                               self.trial_scale),
                                                 self.trials.measure, f"screen-{candidate.label}", context,
                                                 time_limit_s=limit_s))
        row = record.row
        gain = gain_pct(row.throughput, self.reference.throughput) if row.status == OK else None
        win = gain is not None and gain >= win_threshold_pct(self.settings.min_effect_pct)
        if search.measures_compile_cost(candidate, self.levers.get(candidate.lever)) and row.status == OK:
            self.trials.compile_cost.measured(self.reference.wall_s, row.wall_s)  # every later compile's estimate
        screened = Screened(candidate, row, gain, win, "" if win else self._why_no_win(row))
        self.screens.append(screened)
        self.trials.observer.note(f"{candidate.label}: screened {'n/a' if gain is None else f'{gain:+.1f}%'} ("
                                  + ("a win: confirmed once it is the largest left to find, or when the round's "
                                     "screens are done)" if win else f"{screened.outcome})"))
        return screened

    def _why_no_win(self, row: TrialRow) -> str:
        if row.status != OK:
            return f"not measured: {row.status} ({row.reason or ''})"
        return f"no win (below +{win_threshold_pct(self.settings.min_effect_pct):g}%)"

    def _reference_s(self) -> float:
        """What the round's reference trial takes again: its wall time, less its first compile beyond a compile
        through the caches. The reference of a compiled best may be that best's own screen, reused from tune.jsonl
        with the whole first compile in it (hand-written attention on 2 CPU cores: 24.5 s, where the screens on top
        of it took 2.2-2.4 s), which left a foreach screen "needs about 25 s"."""
        if self.reference is None:
            return 0.0
        saving = cached_compile_saving_s(self.reference.compile_s) if self.state.best_cfg.compile else 0.0
        return self.reference.wall_s - saving

    def _expected_screen_s(self, candidate: search.Candidate) -> Optional[float]:
        """A screen costs what the reference took, plus, for a compile mode, what compiling measured adds (None:
        unknown, a compile mode other than default before default's compile was measured)."""
        plain = self._reference_s()
        if not search.compiles(self.levers.get(candidate.lever)):
            return plain
        return self.trials.compile_cost.trial_s(candidate.value, plain)

    # ---------------------------------------------------------------------------------------- confirmation

    def _confirm(self, screened: Screened) -> bool:
        """Confirm one screened win against the best so far (perflab/tune/confirming.py); True when kept. A
        confirmation refused by --max-trials ends the round's screens too."""
        confirmed = self.confirmer.confirm(screened)
        self.out_of_budget = confirmed.stop or self.out_of_budget
        return confirmed.kept

    def _partner(self, lever: str) -> None:
        """The lever a kept one needs (channels-last after bf16), screened and confirmed at once."""
        partner = ordering.partner_of(lever)
        if partner is None or partner in self.settings.exclude or partner not in self.levers:
            return
        if partner in self.state.lost:
            self.state.lost.remove(partner)  # screened without its partner: a loss there says nothing about it here
        self.state.settled.discard(partner)
        proposal = search.Proposal(partner, f"partner of {lever}", None, None, named=False)
        self.reference = None  # the best changed: the partner is screened against it
        candidates = search.expand(proposal, self.levers[partner], self.state.best_cfg, self.cpu_count)
        for screened in self._screen_lever(candidates):
            self._confirm(screened)
            break

    def lost_in_screens(self) -> list[str]:
        """The levers whose every screen was measured and lost (a loss at a confirmation's full trials is not
        one of them: it stands)."""
        won = {s.candidate.lever for s in self.screens if s.win}
        return list(dict.fromkeys(s.candidate.lever for s in self.screens
                                  if s.row.status == OK and s.candidate.lever in self.state.lost
                                  and s.candidate.lever not in won))

    def lengthen(self, factor: float, levers: list[str]) -> None:
        """The steadier pass: later screens (and their reference) run trials `factor` times as long, and `levers`
        are proposed again. The noise the stop line reads is then the longer references' alone."""
        self.trial_scale *= factor
        self.reference, self.references = None, []
        for lever in levers:
            self.state.lost.remove(lever)
            self.state.settled.discard(lever)

    # ---------------------------------------------------------------------------------------- reporting

    def summary(self) -> list[ScreenEntry]:
        return [screened.entry() for screened in self.screens]


"""A confirmation sized to the time left: fewer, shorter trials rather than none.

A screened win is confirmed by full trials (every --trials, --min-trial-s, the quality gate) judged by compare. When
the budget left cannot hold that, the confirmation runs with fewer trials (at least MIN_CONFIRM_TRIALS: compare's
interval needs two values a side) and, where that is still too long, trials as short as a screen's; compare's
interval is then wider, and the decision records it and the sizing. Only when not even that fits is the win left
"screened, not confirmed", with the command that would confirm it.

Time model (calibrated on the trials already measured): a trial lasts max(its timed steps, --min-trial-s); a full
confirmation costs what its screen cost, plus the trials beyond the screen's one, plus the quality gate (what the
best's full trial took beyond its own trials and the round's reference, the warm worker's start that trial paid
not counted), less what the screen spent compiling beyond a compile through the caches: every trial of a tune
shares Inductor's caches, so the confirmation of a compiled candidate finds the graph its screen compiled
(hand-written attention on 2 CPU cores: 19.1 s of compile in the screen, 0.33 s in its confirmation; an H100's
elementwise chain: 30.8 s, then a 1.8-s confirmation). Counting the screen's compile again left a +26% compile win
"not confirmed: budget (needs about 33 s; 11 s left)" where the confirmation took 6 s.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

SCREEN_MIN_TRIAL_S = 1.0  # a screen's trial: long enough for a DataLoader-fed trial to average its bursts; the
#                           shortest trial a confirmation sized to the time left runs
MIN_CONFIRM_TRIALS = 2  # compare gives no interval with fewer than two trials on a side
# A compile through the caches, as a share of the screen's first compile and at least a floor (measured: 2-6%); the
# estimate stays above what was seen, since a trial that outruns it is stopped at the budget's edge
CACHED_COMPILE_SHARE = 0.15
CACHED_COMPILE_MIN_S = 1.0
# A confirmation whose candidate alone was not steady (or ran beside a busy neighbour) runs once more with trials this
# many times longer, where the budget left holds it: what the stop line advises a user ("give each trial longer").
# On an H200, pin-memory + CUDA graphs screened +32% on a loader-fed step and its confirmation's trials disagreed by
# 88%: the win was dropped unjudged with 39 s of the budget left.
LONGER_TRIALS = 2.0


@dataclass(frozen=True)
class ConfirmationCost:
    """What the trials measured so far say a confirmation costs."""

    screen_s: float  # the candidate's screen: one short trial, its process start, build and warm-up
    screen_min_trial_s: float  # the screen's --min-trial-s
    candidate_steps_s: float  # the candidate's timed steps of one trial (from its screened throughput)
    gate_s: float  # the quality gate (and what else a full trial adds beyond its trials)
    full_trials: int
    full_min_trial_s: float
    cached_compile_saving_s: float = 0.0  # the screen's compile the confirmation does not repeat (the caches)

    def expected_s(self, trials: int, min_trial_s: float) -> float:
        """A confirmation of `trials` trials of at least `min_trial_s` each."""
        screen_trial_s = max(self.candidate_steps_s, self.screen_min_trial_s)
        return (self.screen_s - self.cached_compile_saving_s - screen_trial_s
                + trials * max(self.candidate_steps_s, min_trial_s) + self.gate_s)


def cached_compile_saving_s(screen_compile_s: Optional[float]) -> float:
    """What a confirmation saves on the compile its screen measured: the screen's compile less a compile through the
    caches (CACHED_COMPILE_SHARE of it, at least CACHED_COMPILE_MIN_S); 0 for a screen that compiled nothing."""
    if not screen_compile_s:
        return 0.0
    return max(0.0, screen_compile_s - max(CACHED_COMPILE_MIN_S, CACHED_COMPILE_SHARE * screen_compile_s))


@dataclass(frozen=True)
class ConfirmationSize:
    """The trials a confirmation runs: all of them (`full`), or fewer and shorter ones, and their expected time."""

    trials: int
    min_trial_s: float
    expected_s: float
    full: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """'2 trials of at least 1 s (sized to the budget left)' for notes and the report."""
        if self.full:
            return f"{self.trials} trials"
        return f"{self.trials} trials of at least {self.min_trial_s:g} s (sized to the budget left)"


def gate_s(best_full_s: float, reference_s: float, best_steps_s: float, full_trials: int, full_min_trial_s: float,
           screen_min_trial_s: float) -> float:
    """What a full trial of the best took beyond its timed trials and its screen-sized reference: the quality gate
    and the rest of a full trial's overhead (never below zero)."""
    trials_s = full_trials * max(best_steps_s, full_min_trial_s) - max(best_steps_s, screen_min_trial_s)
    return max(0.0, best_full_s - reference_s - trials_s)


def size_confirmation(cost: ConfirmationCost, left_s: float) -> Optional[ConfirmationSize]:
    """The most trials, then the longest trials, whose expected time fits in `left_s`; None when even
    MIN_CONFIRM_TRIALS trials as short as a screen's do not."""
    lengths = sorted({cost.full_min_trial_s, min(cost.full_min_trial_s, cost.screen_min_trial_s)}, reverse=True)
    fewest = min(MIN_CONFIRM_TRIALS, cost.full_trials)  # --trials 1 given: one trial is the full confirmation
    for trials in range(cost.full_trials, fewest - 1, -1):
        for min_trial_s in lengths:
            expected_s = cost.expected_s(trials, min_trial_s)
            if expected_s <= left_s:
                full = trials == cost.full_trials and min_trial_s == cost.full_min_trial_s
                return ConfirmationSize(trials, min_trial_s, expected_s, full)
    return None


def candidate_alone_unsteady(decision: Any) -> bool:
    """Whether a measured confirmation went unjudged for the candidate's own timings only (its trials disagree, or
    it ran beside a busy neighbour), the best's being clean: longer trials of the candidate may settle it."""
    return decision is not None and not decision.judged and list(decision.noisy_sides) == ["candidate"]


def longer_confirmation_s(cost: ConfirmationCost, size: ConfirmationSize, factor: float = LONGER_TRIALS) -> float:
    """A confirmation of `size` again with each trial `factor` times longer (its steps and --min-trial-s)."""
    trial_s = max(cost.candidate_steps_s, size.min_trial_s)
    return size.expected_s + (factor - 1) * size.trials * trial_s

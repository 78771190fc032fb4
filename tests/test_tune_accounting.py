"""tune's accounting as values: the budget (spent, left, held back), a confirmation sized to the time left, the stop
reason and its line, and the profile's schedule (no processes)."""
import pytest

from perflab.tune.budget import Budget
from perflab.tune.confirmation import ConfirmationCost, gate_s, size_confirmation
from perflab.tune.driver import SHORT_PROFILE_STEPS, profile_steps
from perflab.tune.stop import StopContext, StopKind, StopReason, stop_line
from perflab.tune.trial import PROFILE_STEPS


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_budget_charges_recorded_trials_once_and_the_time_spent_between_them():
    clock = Clock()
    budget = Budget(200.0, clock=clock)
    budget.charge("start", 30.0)  # a reused row (--resume), before this process started
    assert budget.spent_s == 30.0
    budget.start()
    with budget.running_trial():
        clock.now += 20.0
    budget.charge("screen-a", 20.0)
    budget.charge("screen-a", 20.0)  # a row reused within the session (a screen as a reference) costs nothing
    clock.now += 5.0  # a diagnosis, between trials
    assert budget.spent_s == pytest.approx(55.0)
    assert budget.finish_reserve_s == 4.0 and budget.left_s() == pytest.approx(141.0)
    assert budget.spent_line() == "55 s of 200 s"


def test_the_budget_holds_time_back_for_a_confirmation_and_says_when_it_is_spent():
    clock = Clock()
    budget = Budget(100.0, clock=clock)
    budget.start()
    assert budget.finish_reserve_s == 2.0  # 2% of a short budget, not 4 s
    budget.hold(30.0)
    assert budget.free_s() == pytest.approx(68.0) and budget.left_s() == pytest.approx(98.0)
    budget.hold(500.0)
    assert budget.free_s() == 0.0  # never negative
    assert not budget.is_spent()
    clock.now += 97.5  # 0.5 s left for a trial: less than one can use
    assert budget.is_spent()
    assert budget.share_s(0.15) == 15.0


def cost(**changes):
    base = dict(screen_s=3.0, screen_min_trial_s=1.0, candidate_steps_s=0.1, gate_s=4.0, full_trials=3,
                full_min_trial_s=3.0)
    return ConfirmationCost(**{**base, **changes})


def test_a_confirmation_is_full_when_it_fits_and_fewer_shorter_trials_when_it_does_not():
    assert cost().expected_s(3, 3.0) == pytest.approx(15.0)  # the screen, less its trial, 3 x 3 s, the gate
    full = size_confirmation(cost(), 20.0)
    assert full.full and (full.trials, full.min_trial_s) == (3, 3.0)
    shorter = size_confirmation(cost(), 10.0)
    assert not shorter.full and (shorter.trials, shorter.min_trial_s) == (3, 1.0)  # more trials before longer ones
    fewest = size_confirmation(cost(), 8.0)
    assert (fewest.trials, fewest.min_trial_s, fewest.expected_s) == (2, 1.0, 8.0)
    assert size_confirmation(cost(), 7.9) is None  # not even two short trials: left unconfirmed
    assert "sized to the budget left" in fewest.describe()
    one = size_confirmation(cost(full_trials=1), 100.0)  # --trials 1 given: one trial is the whole confirmation
    assert one.full and one.trials == 1


def test_the_quality_gate_is_what_a_full_trial_of_the_best_took_beyond_its_trials_and_its_reference():
    # a full trial of 15 s, its reference 3 s, 3 trials of 3 s against the reference's one of 1 s: 4 s of gate
    assert gate_s(15.0, 3.0, 0.3, 3, 3.0, 1.0) == pytest.approx(4.0)
    assert gate_s(5.0, 3.0, 0.3, 3, 3.0, 1.0) == 0.0  # never negative


def test_the_stop_reason_is_a_value_rendered_to_the_stop_line():
    won = StopReason(StopKind.NO_LEVER_WON, "every proposed lever was tried, refused or lost")
    line = stop_line(won, StopContext("bf16", kept=["bf16"]))
    assert line == "no further lever won: every proposed lever was tried, refused or lost; best: bf16 (kept: bf16)"
    noisy = stop_line(won, StopContext("start", noise="but the start moves 9%", advice=["remove the sync"]))
    assert noisy.startswith("inconclusive: no lever won: every proposed lever was tried, refused or lost, but the "
                            "start moves 9%; the diagnosis advises: remove the sync; best: start (kept: nothing)")
    left = stop_line(StopReason(StopKind.NO_LEVER_LEFT, "host-device sync"), StopContext("start", advice=["fix"]))
    assert left == "no lever left to try for host-device sync; the diagnosis advises: fix; best: start (kept: nothing)"
    assert StopReason(StopKind.MAX_TRIALS, "4").text() == "--max-trials 4 reached"
    cut = stop_line(StopReason(StopKind.BUDGET_SPENT, "90 s of 90 s"),
                    StopContext("start", unconfirmed=["compile=default screened +787%, not confirmed: budget"],
                                profile_cut="the profile of start was cut at its limit"))
    assert cut == ("budget spent: 90 s of 90 s; best: start (kept: nothing); compile=default screened +787%, not "
                   "confirmed: budget; the profile of start was cut at its limit")
    assert StopReason(StopKind.INTERRUPTED).to_dict() == {"kind": "interrupted", "detail": ""}


def test_a_profile_records_one_active_step_where_the_step_launches_thousands_of_kernels_or_the_last_was_cut():
    assert profile_steps(30, None, last_profile_cut=False) == PROFILE_STEPS
    assert profile_steps(30, 6900.0, last_profile_cut=False) == SHORT_PROFILE_STEPS
    assert profile_steps(30, 120.0, last_profile_cut=True) == SHORT_PROFILE_STEPS
    assert profile_steps(2, None, last_profile_cut=False) == 2  # never more than the run's own steps

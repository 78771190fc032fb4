"""Steady state before timing: the loader's prefilled queue is used up, loader-fed trials are sized by time,
and a run whose trials disagree says it is not steady."""
from __future__ import annotations

import perflab
from perflab.config import RunConfig
from perflab.harness.steady import steps_for_time
from perflab.results.metrics import Metrics, Throughput, Trend

TINY = {"hidden": "16", "in_features": "8"}


def test_trials_are_sized_by_time_only_when_they_would_be_shorter():
    assert steps_for_time(30, step_s=0.01, min_trial_s=3.0) == 300
    assert steps_for_time(30, step_s=1.0, min_trial_s=3.0) == 30
    assert steps_for_time(30, step_s=0.01, min_trial_s=0.0) == 30


def test_loader_fed_trials_are_whole_cycles_of_the_workers():
    assert steps_for_time(10, step_s=0.0887, min_trial_s=3.0, cycle=16) == 48  # 34 steps by time, 3 cycles of 16
    assert steps_for_time(10, step_s=0.0887, min_trial_s=3.0, cycle=8) == 40
    assert steps_for_time(10, step_s=1.0, min_trial_s=3.0, cycle=4) == 12
    assert steps_for_time(10, step_s=0.0887, min_trial_s=3.0, cycle=0) == 34  # no workers: time alone


def in_order_loader_finish_times(workers: int, batch_s: float, step_s: float, steps: int) -> list[float]:
    """When each step ends, for a DataLoader whose workers each make a batch in `batch_s` (batch i on worker
    i mod W, returned in order, workers started together) feeding a step of `step_s` < batch_s / W."""
    finished, now = [], 0.0
    for index in range(steps):
        ready = (index // workers + 1) * batch_s + 1e-4 * (index % workers)  # each worker's k-th batch
        now = max(now, ready) + step_s
        finished.append(now)
    return finished


def test_trials_of_whole_cycles_take_the_same_time_wherever_they_start():
    # 16 workers delivering in waves: a 34-step window spans two waits or three depending on where it starts
    # (H100: trials of 34 steps at 16 workers disagreed by 17%); a 48-step window always spans three.
    ends = in_order_loader_finish_times(workers=16, batch_s=1.4, step_s=0.005, steps=600)

    def spread(length: int) -> float:
        windows = [ends[start + length] - ends[start] for start in range(100, 400)]
        return (max(windows) - min(windows)) / min(windows)

    assert spread(34) > 0.3
    assert spread(steps_for_time(10, step_s=0.0887, min_trial_s=3.0, cycle=16)) < 1e-6


def test_a_run_with_workers_uses_up_the_loaders_queue_before_timing():
    result = perflab.run("mlp", RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=2, warmup=1,
                                          workers=1, workload_options=TINY))
    steady = result.metrics.steady_state
    assert steady.steps >= 8 and len(steady.window_step_ms) >= 2  # windows of at least 4 steps, compared
    assert any("untimed steps used up the DataLoader's prefilled queue" in note for note in result.notes)
    assert all(trial.steps == 3 for trial in result.trials)  # on a CPU run trials keep --steps


def test_a_run_without_a_loader_is_timed_at_once():
    result = perflab.run("mlp", RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=2, warmup=1,
                                          data="device", workload_options=TINY))
    assert result.metrics.steady_state is None


def test_unsteady_trials_are_reported(monkeypatch):
    from perflab.harness import runner
    metrics = Metrics.from_dict({"throughput_samples_per_s": {"range_pct": 40.0}, "steady": False})
    assert "not steady" in runner.unsteady_note(metrics)
    assert runner.unsteady_note(Metrics(throughput_samples_per_s=Throughput(range_pct=2.0), steady=True)) is None


def test_the_phase_that_moved_between_trials_is_named():
    from perflab.harness.steady import moving_phase
    # the H100's augment run: forward/backward/optimizer fixed, the data wait drifting between 10-s trials
    trials = [{"data_wait": wait, "forward": 1.3, "backward": 2.1 + jitter, "optimizer": 0.6}
              for wait, jitter in ((3.1, 0.0), (3.8, 0.1), (4.4, 0.2), (3.9, 0.1))]
    moved = moving_phase(trials)
    assert moved["phase"] == "data_wait" and (moved["low_ms"], moved["high_ms"]) == (3.1, 4.4)
    assert moving_phase(trials[:1]) is None
    # every phase moving alike: no single culprit
    assert moving_phase([{"forward": 1.0, "backward": 2.0}, {"forward": 1.5, "backward": 2.5}]) is None


def test_unsteady_note_says_the_input_pipeline_drifts_when_the_data_wait_moved():
    from perflab.harness import runner
    metrics = Metrics.from_dict({"throughput_samples_per_s": {"range_pct": 24.0}, "steady": False,
                                 "unsteady_phase": {"phase": "data_wait", "low_ms": 2.5, "high_ms": 4.4,
                                                    "other_phases_range_ms": {"forward": 0.2}}})
    note = runner.unsteady_note(metrics)
    assert "data_wait phase moved between 2.50 and 4.40 ms" in note and "input pipeline" in note


def test_trials_that_fall_one_after_another_are_a_drift_not_noise():
    from perflab.harness.steady import trend, unsteady_note
    # the H100's driving run at 8 workers: one small rise, otherwise falling, 9% down in all
    drift = trend([227, 221, 209, 201, 207])
    assert drift["direction"] == "falls" and round(drift["change_pct"]) == -9
    assert trend([593, 602, 626, 652, 661])["direction"] == "rises"
    assert trend([4026, 2312, 4693, 4999, 4006]) is None  # swings, not a drift
    assert trend([100, 99, 98, 97.5]) is None  # falls, but by less than half the unsteady range
    assert trend([100, 80, 60]) is None  # too few trials to call a direction
    metrics = Metrics(throughput_samples_per_s=Throughput(range_pct=12.6), steady=False,
                      throughput_trend=Trend.from_dict(drift))
    note = unsteady_note(metrics)
    assert "falls trial after trial (227 -> 207, -9%)" in note and "more trials do not average out" in note

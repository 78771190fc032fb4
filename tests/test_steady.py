"""Steady state before timing: the loader's prefilled queue is used up, loader-fed trials are sized by time,
and a run whose trials disagree says it is not steady."""
from __future__ import annotations

import perflab
from perflab.config import RunConfig
from perflab.harness.steady import steps_for_time

TINY = {"hidden": "16", "in_features": "8"}


def test_trials_are_sized_by_time_only_when_they_would_be_shorter():
    assert steps_for_time(30, step_s=0.01, min_trial_s=3.0) == 300
    assert steps_for_time(30, step_s=1.0, min_trial_s=3.0) == 30
    assert steps_for_time(30, step_s=0.01, min_trial_s=0.0) == 30


def test_a_run_with_workers_uses_up_the_loaders_queue_before_timing():
    result = perflab.run("mlp", RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=2, warmup=1,
                                          workers=1, workload_options=TINY))
    steady = result.metrics["steady_state"]
    assert steady["steps"] >= 8 and len(steady["window_step_ms"]) >= 2  # windows of at least 4 steps, compared
    assert any("untimed steps used up the DataLoader's prefilled queue" in note for note in result.notes)
    assert all(trial.steps == 3 for trial in result.trials)  # on a CPU run trials keep --steps


def test_a_run_without_a_loader_is_timed_at_once():
    result = perflab.run("mlp", RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=2, warmup=1,
                                          data="device", workload_options=TINY))
    assert result.metrics["steady_state"] is None


def test_unsteady_trials_are_reported(monkeypatch):
    from perflab.harness import runner
    metrics = {"throughput_samples_per_s": {"range_pct": 40.0}, "steady": False}
    assert "not steady" in runner.unsteady_note(metrics)
    assert runner.unsteady_note({"throughput_samples_per_s": {"range_pct": 2.0}, "steady": True}) is None


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
    metrics = {"throughput_samples_per_s": {"range_pct": 24.0}, "steady": False,
               "unsteady_phase": {"phase": "data_wait", "low_ms": 2.5, "high_ms": 4.4,
                                  "other_phases_range_ms": {"forward": 0.2}}}
    note = runner.unsteady_note(metrics)
    assert "data_wait phase moved between 2.50 and 4.40 ms" in note and "input pipeline" in note

"""The regret bench's table: tune's share of the best single lever, only where that lever beat the start's noise."""
from benchmarks import bench_tune_regret as regret
from benchmarks.common import Rows

TUNED = {"summary": {"speedup": 1.0, "kept": [], "budget_s": 180, "stop_reason": "no lever won", "screened": []},
         "wall_s": 134.7, "finished": True}


def _measured(base, again, single):
    return {"base": {"throughput": base}, "again": {"throughput": again},
            "singles": {"fused-optimizer": {"throughput": single, "status": "ok", "wall_s": 9.6}}, "pairs": {}}


def test_a_best_single_inside_the_starts_own_noise_gets_no_share(tmp_path):
    line = regret.record(Rows("tune_regret", tmp_path), "noisy", "3m", _measured(1000.0, 1150.0, 1100.0), TUNED)
    assert "| within the noise (15%) |" in line and "| 15.0% |" in line


def test_a_best_single_beyond_the_noise_gets_tunes_share(tmp_path):
    line = regret.record(Rows("tune_regret", tmp_path), "steady", "3m", _measured(1000.0, 1010.0, 2000.0), TUNED)
    assert "| 0.00% |" in line and "within the noise" not in line
    assert regret.noise_pct({"base": {"throughput": 1000.0}, "again": {}}) is None
    assert regret.above_noise(1.2, None) and not regret.above_noise(None, 3.0)


def test_a_best_pair_that_slows_the_step_down_is_no_share_and_not_noise(tmp_path):
    measured = _measured(1000.0, 1044.0, 1290.0)
    measured["pairs"] = {"compile=default+bf16": {"throughput": 470.0, "status": "ok", "wall_s": 12.0}}
    line = regret.record(Rows("tune_regret", tmp_path), "slower", "3m", measured, TUNED)
    assert line.split(" | ")[7] == "n/a"  # tune / best pair: a 0.47x pair has no gain to share
    assert line.split(" | ")[6] == "0.00%"  # tune / best single: 1.29x is beyond the 4.4% noise


def test_tune_and_the_singles_gain_over_one_common_start(tmp_path):
    # pageable_inputs on an H200: the bench's fp32 eager read 1618 then 2094 samples/s; tune's start 2100 and its best
    # (pin-memory) 8550; pin-memory alone 8665. Each over its own start: 4.07x against 5.36x, a 71% "share" for the
    # same lever. Over the common start (the median, 2094): 4.08x against 4.14x.
    measured = _measured(1618.0, 2094.0, 8665.0)
    tuned = {"summary": {**TUNED["summary"], "speedup": 8550.0 / 2100.0, "kept": ["pin-memory"],
                         "start": {"throughput": 2100.0}, "best": {"throughput": 8550.0}},
             "wall_s": 80.8, "finished": True}
    line = regret.record(Rows("tune_regret", tmp_path), "pageable", "2m", measured, tuned)
    expected = 100 * (8550.0 / 2094.0 - 1) / (8665.0 / 2094.0 - 1)
    assert line.split(" | ")[6] == f"{expected:.2f}%"
    assert line.split(" | ")[8] == f"{100 * (2100.0 / 1618.0 - 1):.1f}%"  # the noise: highest start over lowest
    assert regret.common_start(measured, 2100.0) == 2094.0


def test_the_start_is_measured_with_all_its_trials_and_the_levers_with_one(tmp_path, monkeypatch):
    # the start every ratio divides by gets its full trials (one trial of it moved 29%); a lever gets a screen's one
    from perflab.config import RunConfig
    from perflab.tune.trial import TrialOutcome
    seen = []
    monkeypatch.setattr(regret, "run_trial", lambda cfg, *args, **kwargs: seen.append(cfg) or TrialOutcome(
        "error", 0.1, "not run here"))
    start = RunConfig(workload="mlp", device="cpu", steps=3, trials=3, warmup=1, check_quality=True)
    row = regret.measure(tmp_path, "fp32 eager", start, {}, every_trial=True)
    regret.measure(tmp_path, "bf16", start.replace(precision="bf16"), {})
    assert [(cfg.trials, cfg.check_quality) for cfg in seen] == [(3, False), (1, False)]
    assert row["trials"] == 3 and regret._measured(tmp_path)["bf16"]["trials"] == 1

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

"""No vacuous verdict: pass, accept, reproduced and "no lever won" only when the evidence supports them; NaN never
passes; a figure that cannot be right (a share or an efficiency over 100%) is never shown as a figure."""
import copy
import dataclasses
import json
import math

import pytest

from perflab import RunConfig, run
from perflab.cli import main
from perflab.compare import INCONCLUSIVE, NO_CHANGE, NOT_JUDGED, compare_results
from perflab.compare.reproduction import NOT_REPRODUCED, REPRODUCED, reproduction
from perflab.errors import PerflabError
from perflab.harness.steady import UNSTEADY_RANGE_PCT
from perflab.quality import MAX_NOISE_WIDENING, judge_losses, with_noise_floor
from perflab.results.quality import QualityVerdict, Tolerance
from perflab.results import Result, Trial
from perflab.sweep import ScaleRow, SweepPoint
from perflab.sweep.scale import scaling_rows, trusted_efficiency
from perflab.tune.decision import judge, unjudged_line


@pytest.fixture(scope="module")
def measured() -> Result:
    """One real tiny run (3 trials); the cases below derive their sides from it, on a quiet machine."""
    result = run("mlp", RunConfig(workload="mlp", device="cpu", steps=3, trials=3, warmup=1, batch_size=16,
                                  workload_options={"hidden": "16", "in_features": "8"}))
    result.metrics.interference.busy = False
    return result


def at(result: Result, throughputs: list[float]) -> Result:
    """A copy of `result` whose trials ran at `throughputs` samples/s (steps to match)."""
    derived = copy.deepcopy(result)
    derived.trials = [Trial(wall_s=t.samples / value, steps=t.steps, samples=t.samples, throughput_samples_per_s=value,
                            step_ms=[1000 * t.samples / t.steps / value] * t.steps, phase_ms=dict(t.phase_ms))
                      for t, value in zip(result.trials, throughputs)]
    derived.metrics.throughput_samples_per_s.median = sorted(throughputs)[len(throughputs) // 2]
    derived.metrics.latency_ms.p50 = derived.trials[0].step_ms[0]
    # steady as the harness would say of these trials (the fixture's own flag is this machine's load at test time)
    spread_pct = 100 * (max(throughputs) - min(throughputs)) / derived.metrics.throughput_samples_per_s.median
    derived.metrics.steady = spread_pct <= UNSTEADY_RANGE_PCT
    return derived


def saved(result: Result, directory) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    result.save(directory)
    return str(directory)


# ---------------------------------------------------------------------------------------------- the quality gate

def chaotic_tolerance(precision_rtol: float = 1e-2, floor: float = 0.3) -> Tolerance:
    """A bf16-like tolerance widened by a chaotic baseline whose nudged copy moved the loss by `floor`."""
    return with_noise_floor(Tolerance(rtol=precision_rtol, source="bf16 default"), [2.0, 1.0], [2.0, 1.0 + floor])


def test_a_loss_inside_only_a_hugely_widened_noise_floor_is_inconclusive_not_pass():
    tolerance = chaotic_tolerance()
    assert tolerance.widening > MAX_NOISE_WIDENING  # 3 x 0.3 = 0.9: 90x the bf16 tolerance
    verdict = judge_losses([37.1, 37.1], [3.87, 3.87], dataclasses.replace(tolerance, rtol=0.95))
    assert verdict.verdict == "inconclusive"
    assert "too chaotic" in verdict.reason and "1.0e-02" in verdict.reason


def test_the_noise_floor_still_gives_verdicts_inside_its_bound_and_outside_the_widened_tolerance():
    tolerance = chaotic_tolerance()
    assert judge_losses([2.0, 1.0], [2.0, 1.005], tolerance).verdict == "pass"  # within the bf16 tolerance
    assert judge_losses([2.0, 1.0], [2.0, 3.0], tolerance).verdict == "fail"  # beyond even the widened one
    modest = chaotic_tolerance(floor=0.02)  # 3 x 0.02 = 6x the bf16 tolerance: within the bound
    assert modest.widening <= MAX_NOISE_WIDENING
    assert judge_losses([2.0, 1.0], [2.0, 1.05], modest).verdict == "pass"


def test_the_widening_bound_is_documented_where_the_noise_floor_is():
    from pathlib import Path
    text = (Path(__file__).parents[1] / "docs" / "quality.md").read_text()
    assert f"{MAX_NOISE_WIDENING:g}×" in text and "inconclusive" in text


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_a_non_finite_or_non_positive_tolerance_is_refused_in_one_line(value, capsys):
    assert main(["run", "--workload", "mlp", "--device", "cpu", f"--quality-loss-rtol={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--quality-loss-rtol" in err


def test_run_says_an_inconclusive_gate_and_compare_does_not_accept_its_speed_up(measured, tmp_path, capsys):
    base = at(measured, [1000.0, 1010.0, 990.0])
    faster = at(measured, [1500.0, 1520.0, 1490.0])
    faster.quality = QualityVerdict(verdict="inconclusive", reason="final loss 3.87 vs baseline 37.1 ... too chaotic")
    comparison = compare_results(base, faster)
    assert comparison.decision == INCONCLUSIVE and "inconclusive" in comparison.reasons[0]
    decision = judge(base, faster, min_effect_pct=2.0)
    assert not decision.kept and decision.verdict == INCONCLUSIVE and not decision.judged
    assert main(["compare", saved(base, tmp_path / "b"), saved(faster, tmp_path / "f"), "--out", str(tmp_path / "c"),
                 "--fail-on-not-judged"]) == 1
    assert "inconclusive" in capsys.readouterr().out.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------- compare and rerun

def test_one_trial_per_side_is_inconclusive_never_no_significant_change(measured):
    base, cand = at(measured, [1000.0]), at(measured, [260.0])  # -74%, one trial each
    base.trials, cand.trials = base.trials[:1], cand.trials[:1]
    comparison = compare_results(base, cand)
    assert comparison.decision == INCONCLUSIVE and "fewer than 2 trials" in comparison.reasons[0]
    assert reproduction(comparison)[0] == INCONCLUSIVE


def test_rerun_calls_a_large_significant_change_not_reproduced(measured):
    original, repeat = at(measured, [1000.0, 1010.0, 990.0]), at(measured, [260.0, 262.0, 258.0])
    verdict, why = reproduction(compare_results(original, repeat))
    assert verdict == NOT_REPRODUCED and "significantly lower: -74" in why
    same = compare_results(original, at(measured, [1000.0, 1010.0, 990.0]))
    assert same.decision == NO_CHANGE and reproduction(same)[0] == REPRODUCED


def test_rerun_on_a_busy_machine_is_inconclusive(measured):
    repeat = at(measured, [260.0, 262.0, 258.0])
    repeat.metrics.interference = dataclasses.replace(repeat.metrics.interference, busy=True, other_cpu_cores_max=1.5)
    comparison = compare_results(at(measured, [1000.0, 1010.0, 990.0]), repeat)
    assert comparison.decision == NOT_JUDGED
    assert reproduction(comparison)[0] == INCONCLUSIVE


def test_compare_not_judged_is_the_last_line_and_fails_only_when_asked(measured, tmp_path, capsys):
    base = saved(at(measured, [1000.0, 1010.0, 990.0]), tmp_path / "base")
    busy = at(measured, [500.0, 505.0, 495.0])
    busy.metrics.interference = dataclasses.replace(busy.metrics.interference, busy=True, other_cpu_cores_max=1.5)
    busy = saved(busy, tmp_path / "busy")
    assert main(["compare", base, busy, "--out", str(tmp_path / "c1"), "--fail-on-regression", "10"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("not judged") and "busy machine" in last
    assert main(["compare", base, busy, "--out", str(tmp_path / "c2"), "--fail-on-regression", "10",
                 "--fail-on-not-judged"]) == 1


@pytest.mark.parametrize("side", ["base", "candidate"])
def test_compare_refuses_a_nan_throughput_and_names_the_side(measured, tmp_path, capsys, side):
    good = at(measured, [1000.0, 1010.0, 990.0])
    bad = at(measured, [1000.0, float("nan"), 990.0])
    bad.metrics.throughput_samples_per_s.median = float("nan")
    paths = [saved(good, tmp_path / "good"), saved(bad, tmp_path / "bad")]
    if side == "base":
        paths.reverse()
    assert main(["compare", *paths, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"the {side}" in err and "NaN" in err


def test_compare_refuses_a_nan_loss_in_the_quality_record(measured):
    bad = at(measured, [1000.0, 1010.0, 990.0])
    bad.quality = QualityVerdict.from_dict({"verdict": "pass", "metrics": {"final_loss_candidate": math.nan}})
    with pytest.raises(PerflabError, match="candidate.*final_loss_candidate is nan"):
        compare_results(at(measured, [1000.0, 1010.0, 990.0]), bad)


# ---------------------------------------------------------------------------------------------- tune

def test_a_tune_whose_trials_were_not_judged_says_so_and_why():
    rows = [{"verdict": NOT_JUDGED, "judged": False, "why": "speed not judged: the candidate ran on a busy machine"},
            {"verdict": NOT_JUDGED, "judged": False, "why": "speed not judged: the base ran on a busy machine"},
            {"verdict": "refused", "why": "refused by the run: needs CUDA"}, None]
    line = unjudged_line(rows)
    assert line.startswith("2 of 2 trial(s) not judged (not judged)") and "busy machine" in line
    assert unjudged_line([{"verdict": NO_CHANGE, "judged": True, "why": "inside the noise"}]) is None


# ---------------------------------------------------------------------------------------------- one trial, no interval

def test_one_trial_shows_no_interval_on_the_terminal_in_markdown_html_and_compare(tmp_path, capsys):
    out = tmp_path / "one"
    assert main(["run", "--workload", "mlp", "--device", "cpu", "--batch", "8", "--steps", "3", "--warmup", "1",
                 "--trials", "1", "--out", str(out)]) == 0
    terminal = capsys.readouterr().out
    assert "1 trial, no interval" in terminal and "95% CI" not in terminal
    throughput = json.loads((out / "result.json").read_text())["metrics"]["throughput_samples_per_s"]
    assert throughput["ci95_low"] is None and throughput["n"] == 1
    assert main(["report", str(out)]) == 0
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert "1 trial, no interval" in text and "95% CI" not in text.split("throughput", 1)[1].split("\n")[0]
    assert main(["compare", str(out), str(out), "--out", str(tmp_path / "c"), "--report"]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the table may wrap the words
    assert "1 trial, no interval" in shown or "1 trial, no │" in shown
    assert "1 trial, no interval" in (tmp_path / "c" / "report.md").read_text()
    assert "1 trial, no interval" in (tmp_path / "c" / "report.html").read_text()
    comparison = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert comparison["decision"] in (INCONCLUSIVE, NOT_JUDGED)  # one trial (or a busy test machine): no verdict


# ---------------------------------------------------------------------------------------------- scale

def scale_rows(**two) -> list[ScaleRow]:
    base = {"status": "ok", "quality": "pass", "busy": False}
    return scaling_rows([SweepPoint(**base, label="nproc=1", params={"nproc": 1}, throughput=100.0,
                                    config=RunConfig(batch_size=8)),
                         SweepPoint(**{**base, **two}, label="nproc=2", params={"nproc": 2},
                                    config=RunConfig(batch_size=8, nproc=2))])


def test_scale_flags_an_efficiency_over_100_percent_instead_of_showing_it():
    one, two = scale_rows(throughput=1748.0)
    assert two.efficiency_pct == pytest.approx(874.0)
    assert trusted_efficiency(two) is None and trusted_efficiency(one) == pytest.approx(100.0)
    assert any("874% over 100% cannot be right" in flag for flag in two.flags)


def test_scale_shows_each_points_quality_verdict_and_flags_a_busy_machine():
    one, two = scale_rows(throughput=180.0, quality="fail", quality_reason="final loss 9 vs 1", busy=True)
    assert any(flag.startswith("quality gate fail: final loss 9 vs 1") for flag in two.flags)
    assert any("busy machine" in flag for flag in two.flags) and trusted_efficiency(two) is None
    assert not one.flags
    one, two = scale_rows(throughput=180.0)
    busy_base = scaling_rows([dataclasses.replace(one, busy=True), two])
    assert any("1-rank point was timed on a busy machine" in flag for flag in busy_base[1].flags)


def test_the_scale_table_prints_each_quality_verdict_and_no_untrusted_efficiency_figure(tmp_path, capsys):
    from perflab.cli.scale import print_scaling
    from perflab.sweep.scale import ScaleSummary
    rows = scale_rows(throughput=1748.0, quality="fail", quality_reason="final loss NaN")
    summary = ScaleSummary(sweep=type("Sweep", (), {"out": tmp_path})(), rows=rows)
    print_scaling(summary)
    shown = capsys.readouterr().out
    assert "untrusted" in shown and "874.0%" not in shown and "ok (fail)" in shown
    assert "cannot be right" in " ".join(shown.split())


# ---------------------------------------------------------------------------------------------- phase shares

def disjoint_trial(rng, steps: int) -> Trial:
    """A trial whose steps are made of disjoint phases plus a gap, of very different lengths from step to step (a
    generate run's requests: long and short ones)."""
    step_ms, phases = [], []
    for _ in range(steps):
        parts = {"data_wait": rng.uniform(0, 1), "prefill": rng.uniform(0, 5) ** 2, "decode": rng.uniform(0, 40) ** 1.5}
        phases.append(parts)
        step_ms.append(sum(parts.values()) + rng.uniform(0, 0.5))
    names = {name for parts in phases for name in parts}
    return Trial(wall_s=sum(step_ms) / 1e3, steps=steps, samples=steps, throughput_samples_per_s=steps / sum(step_ms),
                 step_ms=step_ms, phase_ms={n: sum(p[n] for p in phases) / steps for n in names})


@pytest.mark.parametrize("seed", range(20))
def test_phase_shares_never_add_up_to_more_than_the_step(seed):
    import random
    from perflab.harness.runner import aggregate
    rng = random.Random(seed)
    trials = [disjoint_trial(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 5))]
    metrics = aggregate(trials, batch_size=1)
    shares = metrics.phase_share_pct
    assert sum(shares.values()) == pytest.approx(100.0, abs=1e-6) or sum(shares.values()) < 100.0
    assert all(0 <= share <= 100 for share in shares.values())
    assert sum(metrics.phases_ms.values()) == pytest.approx(metrics.latency_ms.mean)  # unattributed closes the gap


def test_overlapping_phases_are_shares_of_their_sum_and_a_share_over_100_is_a_bug():
    from perflab.step.phases import check_shares, phase_shares
    overlapped = phase_shares({"data_wait": 4.0, "forward": 8.0, "unattributed": 0.0}, step_ms=10.0)
    assert sum(overlapped.values()) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="bug: phase shares .* 113.6%"):
        check_shares({"prefill": 13.6, "decode": 100.0}, "phase shares")


# ---------------------------------------------------------------------------------------------- ceilings

def test_a_percentage_of_a_ceiling_over_100_is_flagged_not_shown():
    from perflab.calibrate import CEILING_TOO_LOW, percent_of_ceiling
    assert percent_of_ceiling(0.5, 1.0, "MFU") == (50.0, None)
    pct, why = percent_of_ceiling(3.0, 1.0, "MFU")
    assert pct is None and why.startswith(CEILING_TOO_LOW) and "300%" in why


def test_a_run_faster_than_its_calibrated_peak_shows_no_mfu_but_says_recalibrate(monkeypatch, capsys, tmp_path):
    from perflab.harness import runner
    monkeypatch.setattr(runner, "peak_tflops", lambda device, precision: (1e-9, "measured (perflab calibrate)"))
    result = run("mlp", RunConfig(workload="mlp", device="cpu", steps=2, trials=1, warmup=1, batch_size=8))
    assert result.metrics.flops.mfu_pct is None
    assert "ceiling too low: recalibrate" in result.metrics.flops.note


def test_calibrate_times_the_matmul_with_benchmark_blocks_on_every_thread_and_keeps_the_best(monkeypatch):
    import torch
    from perflab import calibrate
    seen = {}

    class FakeTimer:
        def __init__(self, stmt, globals, num_threads):
            seen.update(stmt=stmt, num_threads=num_threads)

        def blocked_autorange(self, min_run_time):
            seen["min_run_time"] = min_run_time
            return type("Measurement", (), {"times": [0.004, 0.002, 0.003]})()

    import torch.utils.benchmark  # calibrate imports it where it times the matmul
    monkeypatch.setattr(torch.utils.benchmark, "Timer", FakeTimer)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    tflops = calibrate.measure_matmul_tflops(torch.device("cpu"), "fp32", 64)
    assert seen["num_threads"] == 7 and seen["min_run_time"] > 0 and "torch.mm" in seen["stmt"]
    assert tflops == pytest.approx(2 * 64**3 / 0.002 / 1e12)  # the best block: noise only slows a block down


# ---------------------------------------------------------------------------------------------- NaN in a script

def test_a_script_whose_loss_goes_nan_is_an_invalid_run_with_a_non_zero_exit(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "perflab", "run", "--warmup", "2", "--out", "run", "--", "python",
                           str(root / "tests" / "scripts" / "nan_loss_train.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "done" in done.stdout and "invalid run" in done.stderr and "NaN/inf" in done.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "invalid" and "loss" in result["status_reason"]

"""perflab compare: changes with confidence intervals, the decision, the CI gate, and clear errors."""
import copy
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from perflab import RunConfig, run
from perflab.cli import main
from perflab.compare import compare_results, load_comparison, regression_exceeds
from perflab.harness.runner import aggregate
from perflab.results.metrics import Flops
from perflab.results import Result, Trial
from perflab.results.quality import QualityVerdict


@pytest.fixture(scope="module")
def measured() -> Result:
    """One real tiny run; the comparisons below derive candidates from it. Its interference record is set to
    quiet: these tests are about the statistics, and a busy test machine is tested in test_reliability.py."""
    result = run("mlp", RunConfig(workload="mlp", device="cpu", steps=3, trials=3, warmup=1, batch_size=32))
    result.metrics.interference.busy = False
    result.metrics.steady = True  # likewise: an unsteady run is not judged (tested below)
    return result


def with_throughputs(result: Result, throughputs: list[float]) -> Result:
    """A copy of `result` whose trials ran at the given throughputs, with steady steps and phases to match."""
    derived = copy.deepcopy(result)
    trials = []
    for trial, throughput in zip(result.trials, throughputs):
        step_ms = 1000 * trial.samples / trial.steps / throughput
        phase_total = sum(trial.phase_ms.values()) or 1.0
        trials.append(Trial(wall_s=trial.samples / throughput, steps=trial.steps, samples=trial.samples,
                            throughput_samples_per_s=throughput, step_ms=[step_ms] * trial.steps,
                            phase_ms={k: v / phase_total * step_ms for k, v in trial.phase_ms.items()}))
    derived.trials = trials
    merged = aggregate(trials, result.config.batch_size)
    derived.metrics = dataclasses.replace(derived.metrics, throughput_samples_per_s=merged.throughput_samples_per_s,
                                          latency_ms=merged.latency_ms, phases_ms=merged.phases_ms,
                                          phase_share_pct=merged.phase_share_pct)
    return derived


def saved(result: Result, directory) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    result.save(directory)
    return str(directory)


def test_identical_runs_are_no_significant_change(measured):
    comparison = compare_results(measured, measured)
    assert comparison.decision == "no significant change"
    assert comparison.metric("throughput").change_pct == pytest.approx(0.0)
    assert comparison.metric("throughput").significant is False
    assert comparison.warnings == []


def test_clear_speedup_is_accepted_with_its_interval(measured):
    base = with_throughputs(measured, [1000.0, 1010.0, 990.0])
    candidate = with_throughputs(measured, [1500.0, 1520.0, 1490.0])
    comparison = compare_results(base, candidate)
    assert comparison.decision == "accept"
    throughput = comparison.metric("throughput")
    assert throughput.change_pct == pytest.approx(50.0)
    assert 30 < throughput.ci_low_pct <= 50 <= throughput.ci_high_pct < 60
    assert comparison.metric("p50 latency").improved
    assert comparison.phases[0].delta_ms < 0  # the phases account for the time saved


def test_speedup_inside_the_noise_is_not_accepted(measured):
    base = with_throughputs(measured, [1000.0, 1200.0, 1400.0])
    candidate = with_throughputs(measured, [1050.0, 1250.0, 1450.0])
    comparison = compare_results(base, candidate)
    assert comparison.decision == "no significant change"
    assert "noise" in comparison.reasons[0]


def test_quality_failure_rejects_whatever_the_speed(measured):
    base = with_throughputs(measured, [1000.0, 1010.0, 990.0])
    candidate = with_throughputs(measured, [3000.0, 3030.0, 2970.0])
    candidate.quality = QualityVerdict.from_dict({"verdict": "fail", "metrics": {"rel_error": 0.31},
                                                  "reason": "relative output error 3.1e-01 > 1e-02 tolerance"})
    comparison = compare_results(base, candidate)
    assert comparison.decision == "reject"
    assert "quality gate" in comparison.reasons[0]
    assert comparison.quality.numbers == {"rel_error": 0.31}


def test_significant_slowdown_is_rejected_and_trips_the_gate(measured):
    base = with_throughputs(measured, [1000.0, 1010.0, 990.0])
    candidate = with_throughputs(measured, [800.0, 810.0, 790.0])
    comparison = compare_results(base, candidate)
    assert comparison.decision == "reject"
    assert regression_exceeds(comparison, 10.0)
    assert not regression_exceeds(comparison, 25.0)


def test_fail_on_regression_sets_the_exit_code(measured, tmp_path):
    base = saved(with_throughputs(measured, [1000.0, 1010.0, 990.0]), tmp_path / "base")
    slower = saved(with_throughputs(measured, [800.0, 810.0, 790.0]), tmp_path / "slower")
    assert main(["compare", base, slower, "--out", str(tmp_path / "c1"), "--fail-on-regression", "10"]) == 1
    assert main(["compare", base, slower, "--out", str(tmp_path / "c2"), "--fail-on-regression", "30"]) == 0
    assert main(["compare", slower, base, "--out", str(tmp_path / "c3"), "--fail-on-regression", "10"]) == 0
    saved_comparison = load_comparison(tmp_path / "c3")
    assert saved_comparison.decision == "accept"
    assert saved_comparison.candidate.path.endswith("base/result.json")


@pytest.mark.parametrize("content", ['{"schema_version": 1, "config"', "[1, 2]", '{"hello": 1}',
                                     '{"schema_version": 1, "config": {}, "environment": {}, "trials": [{"x": 1}], '
                                     '"metrics": {}}'])
def test_corrupt_result_file_is_a_one_line_error(measured, tmp_path, capsys, content):
    bad = tmp_path / "bad" / "result.json"
    bad.parent.mkdir()
    bad.write_text(content)
    good = saved(measured, tmp_path / "good")
    assert main(["compare", good, str(bad), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "result.json" in err and "Traceback" not in err
    assert len(err.replace(str(bad), "PATH").splitlines()) <= 2  # one message (rich may wrap a long path)


def test_runs_on_different_gpus_are_compared_with_a_loud_warning(measured):
    other = copy.deepcopy(measured)
    other.environment["gpu"] = {"name": "NVIDIA H100 80GB HBM3"}
    other.environment["torch"] = "2.4.0"
    comparison = compare_results(measured, other)
    assert any("DIFFERENT HARDWARE" in w for w in comparison.warnings)
    assert any("TORCH" in w for w in comparison.warnings)


def test_kernels_that_account_for_the_difference_come_from_both_traces(measured, tmp_path):
    def trace(directory, kernel_us):
        events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": i * 1000, "dur": 900,
                   "pid": 1, "tid": 1} for i in range(2)]
        events += [{"ph": "X", "cat": "kernel", "name": name, "ts": i * 1000 + 10, "dur": dur, "pid": 0, "tid": 7,
                    "args": {"stream": 7}} for i in range(2) for name, dur in kernel_us.items()]
        (directory / "trace.json").write_text(json.dumps({"traceEvents": events}))
        result = copy.deepcopy(measured)
        result.save(directory)
        return result

    base_dir, cand_dir = tmp_path / "base", tmp_path / "cand"
    base_dir.mkdir(), cand_dir.mkdir()
    base = trace(base_dir, {"sgemm_fp32": 400, "relu": 50})
    candidate = trace(cand_dir, {"sgemm_bf16": 150, "relu": 50})
    comparison = compare_results(base, candidate)
    assert comparison.kernels is not None, comparison.kernel_note
    by_name = {row.kernel: row for row in comparison.kernels}
    assert by_name["sgemm_fp32"].delta_ms == pytest.approx(-0.4)
    assert by_name["sgemm_bf16"].delta_ms == pytest.approx(0.15)
    assert by_name["relu"].delta_ms == pytest.approx(0.0)


def test_without_traces_kernels_are_skipped_with_a_note(measured):
    comparison = compare_results(measured, measured)
    assert comparison.kernels is None and "trace" in comparison.kernel_note


def with_flops(result: Result, per_sample: float, peak_tflops: float, precision: str) -> Result:
    """A copy of `result` whose MFU is derived, as a run derives it, from its throughput, FLOPs and peak."""
    derived = copy.deepcopy(result)
    achieved = per_sample * derived.throughput / 1e12
    derived.config.precision = precision
    derived.metrics.flops = Flops(per_sample=per_sample, achieved_tflops=achieved, peak_tflops=peak_tflops,
                                  peak_source="calibrated", mfu_pct=100 * achieved / peak_tflops)
    return derived


def test_mfu_against_a_different_peak_shows_no_change_and_says_why(measured):
    base = with_flops(with_throughputs(measured, [1000.0, 1010.0, 990.0]), 1e9, 10.0, "fp32")
    candidate = with_flops(with_throughputs(measured, [30.0, 31.0, 29.0]), 1e9, 0.07, "bf16")
    mfu = compare_results(base, candidate).metric("MFU")
    assert mfu.candidate > mfu.base  # MFU rose while throughput fell 97%: only the peak changed
    assert mfu.change_pct is None
    assert "different peaks" in mfu.note and "10 TFLOP/s fp32" in mfu.note and "0.07 TFLOP/s bf16" in mfu.note


def test_mfu_change_notes_a_change_of_flops_per_sample(measured):
    base = with_flops(measured, 1e9, 10.0, "fp32")
    candidate = with_flops(measured, 2e9, 10.0, "fp32")
    mfu = compare_results(base, candidate).metric("MFU")
    assert mfu.change_pct == pytest.approx(100.0)
    assert "FLOPs per sample differ" in mfu.note
    same = compare_results(base, with_flops(measured, 1e9, 10.0, "fp32")).metric("MFU")
    assert same.change_pct == pytest.approx(0.0) and "follows throughput" in same.note


def unsteady(result: Result, spread_pct: float) -> Result:
    """A copy of `result` flagged as its run flags trials that disagree by more than 10% (harness/steady.py)."""
    flagged = copy.deepcopy(result)
    flagged.metrics.steady = False
    flagged.metrics.throughput_samples_per_s.range_pct = spread_pct
    return flagged


def test_a_side_that_is_not_steady_is_judged_only_on_a_change_larger_than_its_spread(measured):
    base = with_throughputs(measured, [1000.0, 1010.0, 990.0])
    slower = unsteady(with_throughputs(measured, [800.0, 810.0, 790.0]), 24.0)
    comparison = compare_results(base, slower)  # -20%, inside the candidate's own 24%
    assert comparison.decision == "not judged"
    assert "the candidate is not steady (trials disagree by 24%)" in comparison.reasons[0]
    assert comparison.noisy_sides == ["candidate"]  # whose timings were unclean, as a value tune can read
    assert not regression_exceeds(comparison, 10.0)
    both = compare_results(unsteady(base, 30.0), slower)
    assert both.decision == "not judged" and both.noisy_sides == ["base", "candidate"] and len(both.noisy) == 1
    faster = with_throughputs(measured, [1500.0, 1520.0, 1490.0])
    flagged_base = compare_results(unsteady(base, 17.0), faster)  # +50%: larger than the base's 17%
    assert flagged_base.decision == "accept"
    assert any("the base is not steady (trials disagree by 17%)" in reason for reason in flagged_base.reasons)
    assert flagged_base.metric("throughput").ci_low_pct < 50 / 1.17  # the interval was widened by the spread
    tenfold = with_throughputs(measured, [10000.0, 10100.0, 9900.0])
    assert compare_results(unsteady(base, 43.0), tenfold).decision == "accept"  # tune's 12x over a 43% base
    assert compare_results(unsteady(base, 17.0), with_throughputs(measured, [1100.0, 1110.0, 1090.0])
                           ).decision == "not judged"
    assert compare_results(base, slower, accept_noisy=True).decision == "reject"  # judged only when asked


def busy_loops(count: int, seconds: float) -> list[int]:
    """The pids of `count` processes that spin a CPU core each, for at most `seconds` (they stop on their own if not
    killed), started outside this process's tree as another user's work would be: the load probe counts this
    process's children as the run's own (its DataLoader workers)."""
    spin = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    pids = []
    for _ in range(count):
        shell = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{spin}" >/dev/null 2>&1 & echo $!'],
                               capture_output=True, text=True, check=True)
        pids.append(int(shell.stdout.strip()))
    return pids


def test_identical_runs_under_a_planted_load_are_never_called_significant():
    """The issue's case: identical runs on a 2-core machine kept busy by two spinning processes. Whatever the load
    does to each run's trials, no comparison of two of them may call a change significant."""
    loops = busy_loops(2, 90)
    try:
        time.sleep(0.2)
        cfg = RunConfig(workload="mlp", device="cpu", steps=4, trials=3, warmup=1, batch_size=32)
        runs = [run("mlp", cfg) for _ in range(7)]  # 21 pairs: the "0 false verdicts in 20"
    finally:
        for pid in loops:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    verdicts = [compare_results(a, b) for a, b in itertools.combinations(runs, 2)]
    false_alarms = [c.reasons[0] for c in verdicts if c.decision in ("accept", "reject")
                    or regression_exceeds(c, 0.0)]
    assert len(verdicts) == 21 and false_alarms == []
    assert any("busy machine" in reason for c in verdicts for reason in c.noisy)  # the load itself was seen

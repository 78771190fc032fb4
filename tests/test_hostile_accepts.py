"""Nothing silent (issue 44): inputs perflab used to accept without a word are refused in one line on stderr with exit
2 and no traceback, or accepted with a note that says what happened."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab import options
from perflab.cli import main
from perflab.config import RunConfig
from perflab.results import Result, Trial
from perflab.tune import tune
from perflab.tune.settings import TuneConfig
from perflab.tune.trial import OK, TrialOutcome

from tests.test_bad_inputs import COMMAND_ARGS, FAST, refused


def test_grad_accum_beyond_the_timed_steps_is_refused(capsys):
    line = refused(capsys, "run", *FAST, "--steps", "2", "--grad-accum", "100000")
    assert "--grad-accum 100000" in line and "at least one optimizer step" in line


def test_grad_accum_within_the_timed_steps_is_accepted():
    assert RunConfig(steps=4, grad_accum=4).validate().grad_accum == 4


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_an_empty_out_is_refused_not_saved_under_runs(capsys, command):
    assert "--out is empty" in refused(capsys, command, *FAST, "--out", "")


def test_a_gpu_cost_that_would_save_as_inf_is_refused(capsys):
    line = refused(capsys, "run", *FAST, "--gpu-cost-per-hour", "1e308")
    assert "--gpu-cost-per-hour must be a positive number up to 1000000" in line


def test_a_node_rank_outside_nnodes_is_refused(capsys):
    line = refused(capsys, "run", *FAST, "--nnodes", "1", "--node-rank", "3")
    assert "--node-rank 3" in line and "below --nnodes" in line


def test_serve_instances_far_beyond_the_cpus_are_refused(capsys, monkeypatch):
    monkeypatch.setattr(options, "usable_cpus", lambda: 2)
    line = refused(capsys, "serve", *COMMAND_ARGS["serve"], "--instances", "500")
    assert "--instances 500 is more than 4x the 2 usable CPU(s)" in line and "--instances 8 or fewer" in line


@pytest.mark.parametrize("argv, says", [
    (["tune", "--budget", "-5m"], "--budget must be more than zero"),
    (["tune", "--budget=-5m"], "--budget must be more than zero"),
    (["tune", "--budget", "99999999999h"], "--budget must be at most 7 days"),
    (["run", "--warmup", "-1", "--", "python", "train.py"], "--warmup -1: give 0 or more steps"),
    (["run", "--warmup", "-1"], "--warmup must be 0 or more"),
])
def test_negative_and_huge_values_are_read_as_values_and_refused(capsys, argv, says):
    command, rest = argv[0], argv[1:]
    args = [] if "--" in rest else COMMAND_ARGS[command]  # a script takes only --out, --warmup, --overwrite
    assert says in refused(capsys, command, *args, *rest)


def test_a_workload_option_given_twice_is_refused_naming_its_key(capsys):
    line = refused(capsys, "run", *FAST, "--option", "hidden=8")
    assert "--option hidden= is given twice" in line


def _saved_result(directory: Path, throughput: float) -> Path:
    step_ms = 1000 * 2 / throughput
    trials = [Trial(wall_s=0.1, steps=4, samples=8, throughput_samples_per_s=throughput * factor,
                    step_ms=[step_ms] * 4, phase_ms={"forward": step_ms}) for factor in (0.99, 1.0, 1.01)]
    metrics = {"throughput_samples_per_s": {"median": throughput}, "latency_ms": {"p50": step_ms, "p95": step_ms,
                                                                                   "p99": step_ms}}
    Result(config=RunConfig(workload="mlp", device="cpu").to_dict(), environment={}, workload={}, trials=trials,
           metrics=metrics).save(directory)
    return directory / "result.json"


def test_compare_refuses_a_negative_base_throughput_naming_the_file_and_field(tmp_path, capsys):
    base = _saved_result(tmp_path / "base", 100.0)
    _saved_result(tmp_path / "cand", 110.0)
    data = json.loads(base.read_text())
    data["metrics"]["throughput_samples_per_s"]["median"] = -100
    base.write_text(json.dumps(data))
    line = refused(capsys, "compare", str(tmp_path / "base"), str(tmp_path / "cand"), "--out", str(tmp_path / "c"))
    assert str(base) in line and "metrics.throughput_samples_per_s.median is -100" in line


@pytest.mark.parametrize("name", ["tune.json", "sweep.json", "sweep.jsonl"])
def test_a_tune_or_sweep_file_from_a_newer_perflab_is_refused(tmp_path, capsys, name):
    if name == "sweep.jsonl":
        (tmp_path / name).write_text(json.dumps({"key": "a", "index": 0, "schema_version": 99}) + "\n")
    else:
        (tmp_path / name).write_text(json.dumps({"schema_version": 99}))
        if name == "sweep.json":
            (tmp_path / "sweep.jsonl").write_text("")
    line = refused(capsys, "report", str(tmp_path))
    assert str(tmp_path / name) in line and "written by a newer perflab" in line


class SlowStart:
    """A tune runner that measures every trial at 100 samples/s and 80 ms a step (no process)."""

    def __call__(self, cfg: RunConfig, kind: str, out: Path, time_limit_s=None) -> TrialOutcome:
        out.mkdir(parents=True, exist_ok=True)
        _saved_result(out, 100.0)
        if kind == "profile":
            (out / "trace.json").write_text("{}")
        return TrialOutcome(OK, 1.0, result=Result.load(out))


def test_tune_says_once_when_its_start_already_breaks_max_p99(tmp_path):
    start = RunConfig(workload="mlp", mode="train", batch_size=2, steps=4, warmup=1, trials=3, device="cpu")
    summary = tune(start, TuneConfig(budget="10m", max_trials=1, max_p99_ms=0.001), tmp_path / "tune",
                   runner=SlowStart(), check_workload=False, cpu_count=2, screening=False)
    said = [note for note in summary["notes"] if "starting point itself breaks" in note]
    assert len(said) == 1 and "--max-p99-ms 0.001" in said[0] and "p99 step latency 20.00 ms" in said[0]
    recorded = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert said[0] in recorded["notes"]

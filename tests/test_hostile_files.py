"""Hand-edited files get one line: every file perflab reads back (result.json, compare.json, sweep.jsonl, tune.jsonl,
tune.json) is checked on load, so a figure of the wrong kind, a string schema version or JSON nested past Python's
limit is refused in one line naming the file and the field (exit 2, no traceback), and the good files are left as they
were. A result with millions of per-step values is summarised, not resampled whole. A bad PERFLAB_MEMORY_LIMIT_MB is
one line too."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab import RunConfig, run
from perflab.cli import main

from tests.test_bad_inputs import refused

FAST = ["--workload", "mlp", "--device", "cpu", "--batch", "2", "--steps", "1", "--warmup", "0", "--trials", "1",
        "--option", "hidden=4", "--option", "in_features=4"]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    """One real tiny run, saved, quiet and steady (the hostile copies below are edits of it)."""
    result = run("mlp", RunConfig(workload="mlp", device="cpu", steps=3, trials=3, warmup=1, batch_size=8))
    result.metrics.interference.busy = False
    result.metrics.steady = True
    directory = tmp_path_factory.mktemp("good")
    result.save(directory)
    return directory


def edited(good_run: Path, directory: Path, edit) -> Path:
    """A copy of the good result.json with `edit(data)` applied, as a user's editor would leave it."""
    data = json.loads((good_run / "result.json").read_text())
    edit(data)
    directory.mkdir(parents=True)
    (directory / "result.json").write_text(json.dumps(data))
    return directory


def snapshot(*directories: Path) -> dict:
    return {path: path.read_bytes() for directory in directories for path in sorted(directory.rglob("*"))
            if path.is_file()}


def set_trial_throughput(data):
    data["trials"][0]["throughput_samples_per_s"] = "fast"


def set_schema_string(data):
    data["schema_version"] = "2"


@pytest.mark.parametrize("edit, says", [
    (set_trial_throughput, "field trials[0].throughput_samples_per_s must be a number or null, found the string "
                           "'fast'"),
    (set_schema_string, "field schema_version must be an integer, found the string '2'"),
])
def test_compare_refuses_a_hand_edited_figure_in_one_line(good_run, tmp_path, capsys, edit, says):
    bad = edited(good_run, tmp_path / "bad", edit)
    before = snapshot(good_run, bad)
    line = refused(capsys, "compare", str(good_run), str(bad), "--out", str(tmp_path / "c"))
    assert str(bad / "result.json") in line and says in line
    assert snapshot(good_run, bad) == before and not (tmp_path / "c").exists()


def test_a_deeply_nested_result_is_too_deeply_nested_not_a_recursion_error(good_run, tmp_path, capsys):
    bad = tmp_path / "deep"
    bad.mkdir()
    (bad / "result.json").write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    line = refused(capsys, "compare", str(good_run), str(bad), "--out", str(tmp_path / "c"))
    assert str(bad / "result.json") in line and "too deeply nested" in line


def test_millions_of_step_times_are_summarised_not_resampled_whole(good_run, tmp_path, capsys):
    def long_trials(data):
        for trial in data["trials"]:
            trial["step_ms"] = [trial["step_ms"][0]] * 1_000_000
    long = edited(good_run, tmp_path / "long", long_trials)
    assert main(["compare", str(good_run), str(long), "--out", str(tmp_path / "c")]) == 0
    saved = json.loads((tmp_path / "c" / "compare.json").read_text())
    p50 = next(row for row in saved["metrics"] if row["name"] == "p50 latency")
    assert "3000000 per-step values" in p50["note"] and "20000 evenly spaced quantiles" in p50["note"]
    assert len(saved["candidate"]["step_ms"]) == 20_000


def test_a_string_figure_in_compare_json_is_one_line(good_run, tmp_path, capsys):
    assert main(["compare", str(good_run), str(good_run), "--out", str(tmp_path / "c")]) == 0
    path = tmp_path / "c" / "compare.json"
    data = json.loads(path.read_text())
    data["metrics"][0]["change_pct"] = "+5%"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    line = refused(capsys, "report", str(tmp_path / "c"))
    assert str(path) in line and "metrics[0].change_pct must be a number or null, found the string '+5%'" in line


def test_a_string_figure_in_sweep_jsonl_is_one_line(tmp_path, capsys):
    rows = [{"index": 0, "key": "a", "status": "ok", "throughput": 100.0, "p95_ms": 1.0},
            {"index": 1, "key": "b", "status": "ok", "throughput": "lots", "p95_ms": 1.0}]
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = snapshot(tmp_path)
    line = refused(capsys, "report", str(tmp_path))
    assert f"{tmp_path / 'sweep.jsonl'} line 2: field throughput must be a number or null" in line
    assert snapshot(tmp_path) == before


def test_a_string_figure_in_tune_jsonl_is_one_line_on_resume(tmp_path, capsys):
    row = {"index": 0, "key": "run-x", "kind": "run", "config": {"workload": "mlp", "device": "cpu"},
           "status": "ok", "throughput": 100.0, "wall_s": "12 s"}
    (tmp_path / "tune.jsonl").write_text(json.dumps(row) + "\n")
    before = snapshot(tmp_path)
    line = refused(capsys, "tune", "--resume", "--out", str(tmp_path))
    assert f"{tmp_path / 'tune.jsonl'} line 1: field wall_s must be a number or null, found the string '12 s'" in line
    assert snapshot(tmp_path) == before


def test_a_string_figure_in_tune_json_is_one_line(tmp_path, capsys):
    meta = {"start": {"throughput": 100.0}, "best": {"throughput": 120.0}, "speedup": "1.2x", "chain": []}
    (tmp_path / "tune.json").write_text(json.dumps(meta))
    line = refused(capsys, "report", str(tmp_path))
    assert str(tmp_path / "tune.json") in line and "field speedup must be a number or null, found the string" in line


def test_a_tune_json_link_with_a_string_gain_is_one_line(tmp_path, capsys):
    meta = {"start": {"throughput": 100.0}, "chain": [{"name": "t1", "label": "bf16", "kept": True,
                                                       "measured_gain_pct": "12"}]}
    (tmp_path / "tune.json").write_text(json.dumps(meta))
    assert "field chain[0].measured_gain_pct must be a number or null" in refused(capsys, "report", str(tmp_path))


@pytest.mark.parametrize("value", ["abc", "-5", "nan"])
def test_a_bad_memory_limit_in_the_environment_is_one_line(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("PERFLAB_MEMORY_LIMIT_MB", value)
    line = refused(capsys, "memory", *FAST, "--out", str(tmp_path / "m"))
    assert f"PERFLAB_MEMORY_LIMIT_MB must be a positive finite number of MiB, got {value!r}" in line


def test_compare_of_unsteady_runs_says_not_judged_and_exits_as_for_a_busy_machine(good_run, tmp_path, capsys):
    flagged = edited(good_run, tmp_path / "flagged", lambda data: data["metrics"].update(steady=False))
    data = json.loads((flagged / "result.json").read_text())
    data["metrics"]["throughput_samples_per_s"]["range_pct"] = 21.0
    (flagged / "result.json").write_text(json.dumps(data))
    assert main(["compare", str(good_run), str(flagged), "--out", str(tmp_path / "c1")]) == 0
    out = capsys.readouterr().out
    assert "not judged" in out and "candidate is not steady (trials disagree by 21%)" in " ".join(out.split())
    assert main(["compare", str(good_run), str(flagged), "--out", str(tmp_path / "c2"), "--fail-on-not-judged"]) == 1

import json
import os

import pytest

from perflab.config import RunConfig, ScriptConfig
from perflab.errors import PerflabError
from perflab.results.metrics import Memory
from perflab.results import SCHEMA_VERSION, Result, Trial, write_json_atomic


def make_result() -> Result:
    trial = Trial(wall_s=1.0, steps=2, samples=8, throughput_samples_per_s=8.0, step_ms=[500.0, 500.0],
                  phase_ms={"forward": 400.0})
    metrics = {"throughput_samples_per_s": {"median": 8.0}}
    return Result(config={"workload": "mlp"}, environment={"torch": "x"}, workload={"name": "mlp"},
                  trials=[trial], metrics=metrics)


def test_result_round_trips_through_json(tmp_path):
    result = make_result()
    path = result.save(tmp_path)
    loaded = Result.load(tmp_path)
    assert path == tmp_path / "result.json"
    assert loaded.trials[0] == result.trials[0]
    assert loaded.throughput == 8.0
    assert loaded.schema_version == SCHEMA_VERSION
    assert loaded.path == str(path)


def test_result_file_has_the_documented_top_level_keys(tmp_path):
    make_result().save(tmp_path)
    data = json.loads((tmp_path / "result.json").read_text())
    for key in ("schema_version", "perflab_version", "command", "config", "environment", "workload",
                "trials", "metrics", "timing", "levers", "quality", "diagnosis", "created_utc"):
        assert key in data


def test_atomic_write_keeps_the_old_file_when_serialising_fails(tmp_path):
    target = tmp_path / "result.json"
    write_json_atomic(target, {"ok": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert os.listdir(tmp_path) == ["result.json"]  # no temp file left behind


def test_loading_a_corrupt_file_says_so(tmp_path):
    (tmp_path / "result.json").write_text('{"schema_version": 1, "conf')
    with pytest.raises(PerflabError, match="not valid JSON"):
        Result.load(tmp_path)


def test_loading_a_non_result_names_the_missing_keys(tmp_path):
    (tmp_path / "result.json").write_text('{"hello": 1}')
    with pytest.raises(PerflabError, match="missing schema_version"):
        Result.load(tmp_path)


def test_loading_a_newer_schema_asks_for_an_upgrade(tmp_path):
    data = make_result().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "result.json").write_text(json.dumps(data))
    with pytest.raises(PerflabError, match="upgrade perflab"):
        Result.load(tmp_path)


def test_loading_a_missing_path_explains_what_to_pass(tmp_path):
    with pytest.raises(PerflabError, match="give a run directory"):
        Result.load(tmp_path / "nope")


def test_peak_memory_is_the_gpu_peak_when_measured_and_the_host_rss_otherwise():
    result = make_result()
    result.metrics.memory = Memory(host_peak_rss_mb=700.0)
    assert (result.peak_memory.mb, result.peak_memory.on_gpu) == (700.0, False)
    assert "host peak RSS" in result.peak_memory.label
    result.metrics.memory = Memory(peak_allocated_mb=1200.0, peak_reserved_mb=1500.0)
    assert (result.peak_memory.mb, result.peak_memory.on_gpu) == (1200.0, True)
    assert result.peak_memory.label == "GPU peak allocated"


def test_result_json_gets_the_file_mode_of_any_other_output(tmp_path):
    before = os.umask(0o022)
    try:
        make_result().save(tmp_path)
        (tmp_path / "report.md").write_text("")  # how reports and traces are written: a plain open()
    finally:
        os.umask(before)
    mode = (tmp_path / "result.json").stat().st_mode & 0o777
    assert mode == (tmp_path / "report.md").stat().st_mode & 0o777 == 0o644


SCRIPT_CONFIG = {"workload": "script:train.py", "mode": "train", "batch_size": 8, "precision": None, "device": "cpu",
                 "warmup": 5, "steps": 10, "trials": 1, "workers": 0, "sync_phases": False,
                 "script": {"path": "train.py", "args": ["--epochs", "1"]}, "step_source": "optimizer"}


def test_a_runs_config_reads_back_as_a_run_config_with_attributes(tmp_path):
    make_result().save(tmp_path)
    loaded = Result.load(tmp_path)
    assert isinstance(loaded.config, RunConfig) and not isinstance(loaded.config, ScriptConfig)
    assert loaded.config.workload == "mlp" and loaded.config.steps == RunConfig().steps  # missing keys: defaults
    assert json.loads((tmp_path / "result.json").read_text())["config"] == RunConfig(workload="mlp").to_dict()


def test_a_script_runs_config_is_typed_in_memory_and_saved_as_the_scripts_own_keys(tmp_path):
    result = make_result()
    result.config = ScriptConfig.from_dict(SCRIPT_CONFIG)
    result.save(tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["config"] == SCRIPT_CONFIG
    loaded = Result.load(tmp_path)
    assert isinstance(loaded.config, ScriptConfig)
    assert loaded.config.step_source == "optimizer" and loaded.config.precision is None
    assert loaded.config.script["args"] == ["--epochs", "1"]


def test_a_config_that_is_not_an_object_is_one_line_naming_the_file(tmp_path):
    data = make_result().to_dict()
    data["config"] = ["mlp"]
    (tmp_path / "result.json").write_text(json.dumps(data))
    with pytest.raises(PerflabError, match="malformed config"):
        Result.load(tmp_path)

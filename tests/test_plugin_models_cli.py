"""Models called the way their libraries make them (dict, tuple, tensor inputs) through every command, and
errors from the user's own code: exit 2, what perflab was doing, only the user's frames (--debug: all)."""
import importlib.util
import json

import pytest

from perflab.cli import main
from tests.cli_process import ROOT, load, perflab_cli

PLUGIN = "tests/plugins/dict_model.py"
TINY = ["--steps", "2", "--warmup", "1", "--trials", "1", "--batch", "4", "--device", "cpu"]


@pytest.fixture(autouse=True)
def at_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("PERFLAB_DEBUG", raising=False)


@pytest.fixture(scope="module")
def dict_run(tmp_path_factory):
    """A nameless dict-input plugin trained with the quality gate and a checkpoint every step."""
    out = tmp_path_factory.mktemp("dict") / "run"
    done = perflab_cli("run", "--workload", PLUGIN, *TINY, "--check-quality", "--quality-steps", "2",
                       "--checkpoint-every", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_dict_inputs_run_with_the_quality_gate_and_checkpoints(dict_run):
    result = load(dict_run)
    assert result["workload"]["name"] == "dict_model"  # Workload(name=...) omitted: the file's stem
    assert result["quality"]["verdict"] == "pass"
    assert result["workload"]["flops_per_sample"] > 0
    assert (dict_run / "checkpoint.pt").is_file()


@pytest.mark.parametrize("inputs,output,mode", [("tuple", "dict", "train"), ("tensor", "tuple", "infer"),
                                                ("dict", "dataclass", "infer")])
def test_inputs_and_outputs_of_every_shape_pass_the_quality_gate(tmp_path, inputs, output, mode):
    out = tmp_path / "run"
    assert main(["run", "--workload", PLUGIN, *TINY, "--mode", mode, "--option", f"inputs={inputs}",
                 "--option", f"output={output}", "--check-quality", "--quality-steps", "2", "--out", str(out)]) == 0
    quality = load(out)["quality"]
    assert quality["verdict"] == "pass"
    if mode == "infer":
        assert quality["metrics"]["rel_error"] == 0 and quality["metrics"]["top1_agreement"] == 1.0


def test_profile_of_a_dict_input_model_traces_its_phases(tmp_path):
    out = tmp_path / "profile"
    assert main(["profile", "--workload", PLUGIN, *TINY, "--steps", "4", "--wait", "1", "--warmup-steps", "1",
                 "--active", "1", "--out", str(out)]) == 0
    assert load(out)["artifacts"]["trace"] == "trace.json"


def test_sweep_over_a_tuple_input_model_records_every_point(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--workload", PLUGIN, "--option", "inputs=tuple", "--steps", "2", "--warmup", "1",
                 "--trials", "1", "--device", "cpu", "--batch", "2,4", "--out", str(out)]) == 0
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["best"] is not None


def test_compare_of_two_dict_input_runs(tmp_path, dict_run, capsys):
    other = tmp_path / "other"
    assert main(["run", "--workload", PLUGIN, *TINY, "--out", str(other)]) == 0
    assert main(["compare", str(dict_run), str(other)]) == 0
    assert "dict_model" in capsys.readouterr().out


def test_nan_logits_inside_a_dataclass_output_mark_the_run_invalid(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--workload", PLUGIN, *TINY, "--mode", "infer", "--option", "fail=nan",
                 "--out", str(out)]) == 1
    assert load(out)["status"] == "invalid"


# ------------------------------------------------------------------ errors from the user's own code

def assert_only_user_frames(stderr: str, line: str) -> None:
    assert f"dict_model.py:{line}" in stderr
    assert "site-packages" not in stderr and "torch/" not in stderr
    assert str(ROOT / "perflab") not in stderr
    assert "Traceback" not in stderr


def plugin_line(text: str) -> int:
    """The line number of `text` in the plugin, so the tests follow edits of it."""
    lines = (ROOT / PLUGIN).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def test_forward_failure_shows_what_perflab_was_doing_and_only_the_users_frame():
    done = perflab_cli("run", "--workload", PLUGIN, *TINY, "--option", "fail=forward")
    assert done.returncode == 2
    assert "calling your model's forward on a batch of type dict with keys input_ids, attention_mask raised " \
           "ValueError: planted failure in forward" in done.stderr
    assert_only_user_frames(done.stderr, plugin_line('raise ValueError("planted failure in forward")'))


def test_debug_prints_the_full_traceback():
    done = perflab_cli("run", "--workload", PLUGIN, *TINY, "--option", "fail=forward", "--debug")
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr
    assert "torch/nn/modules/module.py" in done.stderr and "perflab/step/calls.py" in done.stderr


def test_perflab_debug_variable_prints_the_full_traceback_too(monkeypatch, capsys):
    monkeypatch.setenv("PERFLAB_DEBUG", "1")
    assert main(["run", "--workload", PLUGIN, *TINY, "--option", "fail=loss"]) == 2
    stderr = capsys.readouterr().err
    assert "Traceback (most recent call last)" in stderr and "perflab/step/calls.py" in stderr


def test_dataset_failure_in_a_worker_process_shows_the_workers_user_frame(capsys):
    assert main(["run", "--workload", PLUGIN, *TINY, "--workers", "1", "--option", "fail=dataset"]) == 2
    stderr = capsys.readouterr().err
    assert "loading a batch of 4 items from your dataset" in stderr and "KeyError" in stderr
    assert "in a DataLoader worker process" in stderr
    assert_only_user_frames(stderr, plugin_line('raise KeyError(f"planted failure'))


@pytest.mark.parametrize("fail,doing,raised", [
    ("build", "running your tests/plugins/dict_model.py (build(cfg))", 'raise ValueError("planted failure in build")'),
    ("dataset", "loading a batch of 4 items from your dataset", 'raise KeyError(f"planted failure'),
    ("loss", "calling your loss_fn on the model's output of type ClassifierOutput",
     'raise RuntimeError("planted failure in the loss")'),
])
def test_user_code_failures_exit_2_with_the_users_frame(fail, doing, raised, capsys):
    assert main(["run", "--workload", PLUGIN, *TINY, "--option", f"fail={fail}"]) == 2
    stderr = capsys.readouterr().err
    assert doing in stderr
    assert_only_user_frames(stderr, plugin_line(raised))


def test_build_returning_the_wrong_type_points_at_the_build_function(capsys):
    assert main(["run", "--workload", PLUGIN, *TINY, "--option", "fail=type"]) == 2
    stderr = capsys.readouterr().err
    assert f"build(cfg) at {ROOT / PLUGIN}:{plugin_line('def build(cfg)')} returned TinyTextClassifier" in stderr


def test_syntax_error_shows_the_file_line_and_the_offending_line(tmp_path, capsys):
    plugin = tmp_path / "broken.py"
    plugin.write_text("import torch\n\n\ndef build(cfg)\n    return None\n")
    assert main(["run", "--workload", str(plugin), *TINY]) == 2
    stderr = capsys.readouterr().err
    assert f"syntax error at {plugin}:4" in stderr and "    def build(cfg)\n" in stderr
    assert "Traceback" not in stderr


def test_a_missing_library_imported_by_the_plugin_names_the_import_line(tmp_path, capsys):
    plugin = tmp_path / "needs_lib.py"
    plugin.write_text("import torch\nimport library_that_is_not_installed\n\ndef build(cfg):\n    return None\n")
    assert main(["run", "--workload", str(plugin), *TINY]) == 2
    stderr = capsys.readouterr().err
    assert "ModuleNotFoundError: No module named 'library_that_is_not_installed'" in stderr
    assert f"{plugin}:2" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("example,library", [("examples/hf_text_classifier.py", "transformers"),
                                             ("examples/hf_causal_lm.py", "transformers"),
                                             ("examples/timm_model.py", "timm")])
def test_an_example_whose_library_is_missing_says_how_to_install_it(example, library, capsys):
    if importlib.util.find_spec(library) is not None:
        pytest.skip(f"{library} is installed here")
    assert main(["run", "--workload", example, *TINY]) == 2
    assert "pip install 'perflab[models]'" in capsys.readouterr().err


def test_a_transformers_causal_lm_generates_and_decodes_speculatively_through_the_plugin(tmp_path):
    """GPT2LMHeadModel through the transformers convention: its own cache object kept between tokens and cropped
    past rejected drafts; the gate requires speculative output identical to plain greedy decoding."""
    pytest.importorskip("transformers")
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    common = ["run", "--workload", "examples/hf_causal_lm.py", "--mode", "infer", "--device", device,
              "--steps", "2", "--trials", "1", "--warmup", "1", "--quality-steps", "1"]
    assert main([*common, "--out", str(tmp_path / "plain"), "--no-check-quality"]) == 0
    assert main([*common, "--out", str(tmp_path / "spec"), "--speculative", "3",
                 "--draft", "examples/hf_causal_lm.py:build_draft"]) == 0
    plain, spec = (tmp_path / name / "result.json" for name in ("plain", "spec"))
    generation = json.loads(spec.read_text())["metrics"]["generation"]
    assert json.loads(plain.read_text())["metrics"]["generation"]["tpot_ms"]["p50"] > 0
    assert 0 <= generation["speculative"]["acceptance_rate"] <= 1
    assert json.loads(spec.read_text())["quality"]["verdict"] == "pass"

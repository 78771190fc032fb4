"""perflab run|profile -- python script.py: a user's script, unchanged, measured and diagnosed in real subprocesses."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from perflab.cli import main
from perflab.script.attach import ScriptProbe
from perflab.script.command import parse_command
from perflab.script.steps import FORWARD, MARK, OPTIMIZER, StepDetector
from perflab.script.timeline import StepTimeline

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
QUICK_PROFILE = ["--warmup", "2", "--wait", "1", "--warmup-steps", "1", "--active", "3"]


def perflab(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "perflab", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_slow_dataloader_in_an_unmodified_script_is_diagnosed_as_input_pipeline(tmp_path):
    done = perflab("profile", *QUICK_PROFILE, "--out", "run", "--", "python", str(SCRIPTS / "slow_loader_train.py"),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["diagnosis"]["bottleneck"] == "input pipeline"
    assert result["config"]["step_source"] == OPTIMIZER and result["config"]["mode"] == "train"
    assert result["config"]["batch_size"] == 8 and result["config"]["workers"] == 0
    assert result["metrics"]["phase_share_pct"]["data_wait"] > 50
    assert result["metrics"]["steps_per_s"] > 0 and result["metrics"]["steps_seen"] == 32  # 256 items / batch 8
    assert (tmp_path / "run" / "trace.json").is_file() and (tmp_path / "run" / "diagnosis.json").is_file()
    assert "diagnosis: input pipeline" in done.stdout
    assert "in your script, workers: DataLoader(..., num_workers=N)" in done.stdout  # levers as code, not flags


def test_item_calls_in_each_step_show_in_the_diagnosis_evidence(tmp_path):
    # In this process (the script runs in-process either way): a subprocess would only add torch's import time.
    assert main(["profile", *QUICK_PROFILE, "--out", str(tmp_path / "run"), "--", "python",
                 str(SCRIPTS / "item_per_step_train.py")]) == 0
    diagnosis = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    sync = [f for f in diagnosis["findings"] if f["cls"] == "host-device sync"]
    assert sync, diagnosis["findings"]
    assert sync[0]["evidence"]["item_calls_per_step"] == pytest.approx(2.0)  # loss and accuracy; AdamW's are not counted


def test_inference_script_gets_steps_from_its_model_and_keeps_its_argv_stdout_and_exit_code(tmp_path):
    done = perflab("run", "--warmup", "2", "--out", "run", "--", "python", str(SCRIPTS / "infer_argv_exit.py"),
                   "--batches", "12", "--exit-code", "3", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "argv: ['--batches', '12', '--exit-code', '3'] name: __main__" in done.stdout
    assert "predicted 6 classes per batch" in done.stdout
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["config"]["step_source"] == FORWARD and result["config"]["mode"] == "infer"
    assert result["config"]["batch_size"] == 6
    assert result["metrics"]["steps_seen"] == 11  # 12 model calls: each one after the first ends a step
    assert result["trials"][0]["steps"] == 9  # after the 2 warm-up steps
    assert result["config"]["script"]["args"] == ["--batches", "12", "--exit-code", "3"]
    assert result["command"][-5:] == ["infer_argv_exit.py".join([str(SCRIPTS) + "/", ""]), "--batches", "12",
                                      "--exit-code", "3"]
    assert "trace" not in result["artifacts"] and not (tmp_path / "run" / "trace.json").exists()


def test_failing_script_shows_its_own_traceback_and_perflab_exits_non_zero(tmp_path, capsys):
    code = main(["run", "--warmup", "1", "--out", str(tmp_path / "run"), "--", "python", str(SCRIPTS / "failing.py")])
    assert code == 1
    stderr = capsys.readouterr().err
    assert "Traceback (most recent call last):" in stderr
    assert "ValueError: expected 3 features, got 5" in stderr
    assert 'failing.py", line' in stderr and "check_shapes(batch)" in stderr
    assert "runpy" not in stderr and "perflab" not in stderr.split("Traceback")[1]  # only the script's own frames
    result = json.loads((tmp_path / "run" / "result.json").read_text())  # 3 steps ran: what was measured is kept
    assert any("ValueError" in note for note in result["notes"])


def test_ctrl_c_stops_the_script_and_still_writes_the_result(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "perflab", "run", "--warmup", "2", "--out", "run", "--",
                                "python", str(SCRIPTS / "endless_train.py")], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "training"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["metrics"]["steps_seen"] >= 20
    assert any(note.startswith("interrupted (Ctrl-C)") for note in result["notes"])
    assert result["status"] == "interrupted" and "Ctrl-C" in result["status_reason"]  # never "complete"


def test_missing_script_or_module_is_one_clear_line_and_exit_2(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "a"), "--", "python", "no_such_train.py"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "script no_such_train.py does not exist" in err
    assert main(["run", "--", "python", "-m", "no_such_package.train"]) == 2
    assert "no module named 'no_such_package.train'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_options_that_do_not_apply_to_a_script_are_refused(capsys):
    assert main(["run", "--batch", "8", "--", "python", str(SCRIPTS / "failing.py")]) == 2
    assert "--batch does not apply to a script" in capsys.readouterr().err
    assert main(["sweep", "--batch", "8,16", "--", "python", "train.py"]) == 2
    assert "only with `perflab run` or `perflab profile`" in capsys.readouterr().err


def test_command_forms_after_the_double_dash():
    assert parse_command(["python", "train.py", "--lr", "3"]).args == ["--lr", "3"]
    assert parse_command(["train.py"]).target == "train.py"
    module = parse_command([sys.executable, "-m", "pkg.train", "-x"])
    assert (module.target, module.args, module.is_module) == ("pkg.train", ["-x"], True)
    assert parse_command(["-m", "pkg.train"]).shown() == ["python", "-m", "pkg.train"]


def test_a_stronger_step_source_replaces_a_weaker_one_and_then_ignores_it():
    boundaries = []
    detector = StepDetector(boundaries.append)
    detector.model_call_started()  # begins step 1
    detector.model_call_started()  # ends it (inference so far)
    detector.optimizer_stepped(object())  # training after all: the forward-counted step is dropped
    detector.model_call_started()  # an evaluation call between optimizer steps: not a boundary
    assert boundaries == [False, True] and detector.source == OPTIMIZER and detector.replaced == [FORWARD]
    detector.step_mark_closed()
    assert detector.source == MARK and boundaries[-1] is True


def test_only_the_first_optimizer_ends_steps_when_a_script_has_several():
    boundaries = []
    detector = StepDetector(boundaries.append)
    generator, discriminator = object(), object()
    for _ in range(3):
        detector.optimizer_stepped(discriminator)
        detector.optimizer_stepped(generator)
    assert len(boundaries) == 3


def test_probe_puts_back_every_patched_method_and_removes_its_hooks():
    before = (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.backward, "to" in vars(torch.Tensor))
    model = nn.Linear(4, 2)
    timeline = StepTimeline()
    with ScriptProbe(StepDetector(timeline.boundary), timeline) as probe:
        for _ in range(3):
            model(torch.randn(5, 4)).sum().backward()
    assert probe.model is model and probe.batch_size == 5 and timeline.boundaries == 2
    assert (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.backward, "to" in vars(torch.Tensor)) == before
    model(torch.randn(5, 4))
    assert timeline.boundaries == 2 and not model._forward_hooks and not model._forward_pre_hooks  # none left behind


def test_module_run_with_dash_m_counts_the_users_step_marks(tmp_path, monkeypatch, capsys):
    package = tmp_path / "userpkg_marked"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "infer.py").write_text(
        "import torch\nfrom torch import nn\nimport perflab\n\n"
        "model = nn.Linear(4, 2)\n"
        "for index in range(8):\n"
        "    with perflab.mark('step'):  # two model calls per step: only the marks say where a step ends\n"
        "        model(torch.randn(3, 4))\n"
        "        model(torch.randn(3, 4))\n"
        "print('module ran as', __name__)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--warmup", "1", "--out", "run", "--", "python", "-m", "userpkg_marked.infer"]) == 0
    assert "module ran as __main__" in capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["config"]["step_source"] == MARK and result["config"]["script"]["module"] is True
    # The first step was counted by model calls until the first mark closed; the 7 marks after it are the steps.
    assert result["metrics"]["steps_seen"] == 7 and result["trials"][0]["steps"] == 6
    assert main(["rerun", "run"]) == 2  # a script run is repeated with its own command, not from a RunConfig
    assert "-- python -m userpkg_marked.infer" in capsys.readouterr().err


def test_script_ending_before_the_profilers_active_steps_says_how_many_steps_it_saw(tmp_path, capsys):
    code = main(["profile", "--out", str(tmp_path / "run"), "--", "python", str(SCRIPTS / "infer_argv_exit.py"),
                 "--batches", "9"])  # 8 steps; the default schedule needs 5 + 1 + 2 + 3 = 11
    assert code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the script ended after 8 steps" in out and "--active" in out and "let the script run longer" in out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["diagnosis"] is None and "trace" not in result["artifacts"]


def test_timeline_stops_recording_at_its_cap_and_keeps_every_recorded_step(monkeypatch):
    monkeypatch.setattr("perflab.script.timeline.MAX_RECORDED_STEPS", 3)
    timeline = StepTimeline()
    for _ in range(6):
        with timeline.phase("forward"):
            pass
        timeline.boundary(False)
    step_ms, phase_ms = timeline.steps()
    assert timeline.boundaries == 6 and len(step_ms) == 3 and all(ms > 0 for ms in step_ms)
    assert [sorted(phases) for phases in phase_ms] == [["forward"]] * 3


def _perflab_frames_during(call) -> list[str]:
    """The perflab functions Python enters while `call()` runs."""
    entered = []
    perflab_dir = str(ROOT / "perflab")

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(perflab_dir):
            entered.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def test_after_the_first_step_no_perflab_code_runs_inside_the_model_and_no_global_hook_is_left():
    from torch.nn.modules import module as torch_module
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timeline = StepTimeline()
    with ScriptProbe(StepDetector(timeline.boundary), timeline) as probe:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
        assert probe.model is model
        # Global module hooks are gone, including torch's with_kwargs bookkeeping (else every call of a
        # torch.compile'd model warns about global hooks).
        assert not (torch_module._global_forward_pre_hooks or torch_module._global_forward_hooks
                    or torch_module._global_forward_hooks_with_kwargs
                    or torch_module._global_forward_hooks_always_called)
        x = torch.randn(3, 4)
        assert _perflab_frames_during(lambda: model[2](model[1](model[0](x)))) == []  # submodules: torch's fast path
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1  # the model alone: "forward"


def test_copies_are_no_longer_watched_once_steps_show_the_script_makes_none():
    from perflab.script.attach import COPY_WATCH_STEPS
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch_to = torch.Tensor.to
    x = torch.randn(3, 4)
    timeline = StepTimeline()
    with ScriptProbe(StepDetector(timeline.boundary), timeline):
        assert torch.Tensor.to is not torch_to  # watched from the start: the first steps may copy
        for _ in range(COPY_WATCH_STEPS + 1):
            model(x.to(torch.float32)).sum().backward()  # a cast, not a copy to a device
            optimizer.step()
        assert torch.Tensor.to is torch_to and _perflab_frames_during(lambda: x.to(torch.float64)) == []
    assert torch.Tensor.to is torch_to


def test_loader_batches_keep_their_copies_watched_and_casts_skip_perflab_helpers():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 4)), batch_size=4)
    torch_to = torch.Tensor.to
    timeline = StepTimeline()
    with ScriptProbe(StepDetector(timeline.boundary), timeline) as probe:
        for (x,) in loader:
            model(x).sum().backward()
            optimizer.step()
        assert probe.batches == 10 and torch.Tensor.to is not torch_to  # a GPU script's batch.to(device) is timed
        assert _perflab_frames_during(lambda: x.to(torch.float64)) == ["to"]  # one frame for a dtype cast

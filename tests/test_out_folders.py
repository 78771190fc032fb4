"""--out folders: --overwrite never deletes what perflab did not write, one writer per folder, --resume only of the
same search, and counts, rates and stalls that would hang a command are refused or ended with one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.config import RunConfig
from perflab.results.rundir import LOCK_FILE, is_owned, out_lock

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--workload", "mlp", "--device", "cpu", "--batch", "8", "--warmup", "1", "--steps", "2", "--trials", "1",
        "--option", "hidden=16", "--option", "in_features=8"]
RAISING_FORWARD = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
import perflab

class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x):
        raise ValueError("broken forward")

def build(cfg):
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    return perflab.Workload(name="broken", model=Broken(), dataset=data, loss_fn=nn.CrossEntropyLoss())
'''
SLOW_FORWARD = '''
import time
import torch
from torch import nn
from torch.utils.data import TensorDataset
import perflab

class Slow(nn.Linear):
    def forward(self, x):
        time.sleep(0.02)
        return super().forward(x)

def build(cfg):
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    return perflab.Workload(name="slow", model=Slow(4, 2), dataset=data, loss_fn=nn.CrossEntropyLoss())
'''


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def perflab_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


# ------------------------------------------------------------------------------------------------ --overwrite

def test_overwrite_replaces_perflab_files_and_keeps_the_users(tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out)]) == 0
    (out / "trace.json").write_text("{}")  # a perflab file of the earlier run that the new run does not write
    (out / "train.py").write_text("print('mine')")
    (out / "mydata").mkdir()
    (out / "mydata" / "part-0.csv").write_text("1,2,3")
    before = (out / "result.json").stat().st_ino
    assert main(["run", *TINY, "--out", str(out), "--overwrite"]) == 0
    assert (out / "train.py").read_text() == "print('mine')"
    assert (out / "mydata" / "part-0.csv").read_text() == "1,2,3"
    assert not (out / "trace.json").exists(), "a stale perflab file of the earlier run stays behind"
    assert (out / "result.json").stat().st_ino != before and not (out / LOCK_FILE).exists()


def test_every_file_a_profile_and_its_report_write_is_declared_as_perflabs(tmp_path):
    out = tmp_path / "prof"
    assert main(["profile", *TINY, "--steps", "6", "--wait", "0", "--warmup-steps", "1", "--active", "2",
                 "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    written = sorted(path.name for path in out.iterdir())
    assert "trace.json" in written and "report.md" in written
    assert [name for name in written if not is_owned(name)] == []  # --overwrite would leave them behind


def test_compare_overwrite_keeps_the_users_notes(tmp_path):
    run = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(run)]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", str(run), str(run), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("why these two")
    assert main(["compare", str(run), str(run), "--out", str(out)]) == 2  # no --overwrite: refused, nothing touched
    assert main(["compare", str(run), str(run), "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "why these two" and (out / "compare.json").is_file()


def test_overwrite_with_a_failing_forward_or_a_bad_option_leaves_the_earlier_run_intact(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out)]) == 0
    (out / "trace.json").write_text("{}")
    saved = (out / "result.json").read_text()
    plugin = tmp_path / "broken.py"
    plugin.write_text(RAISING_FORWARD)
    capsys.readouterr()
    assert main(["run", "--workload", f"{plugin}:build", "--device", "cpu", "--batch", "8", "--steps", "2",
                 "--trials", "1", "--warmup", "1", "--out", str(out), "--overwrite"]) == 2
    assert "broken forward" in capsys.readouterr().err
    assert main(["run", *TINY, "--quality-steps", "0", "--out", str(out), "--overwrite"]) == 2
    assert (out / "result.json").read_text() == saved and (out / "trace.json").read_text() == "{}"


def test_out_that_is_the_working_directory_home_a_root_or_a_git_root_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('mine')")
    assert main(["run", *TINY, "--out", ".", "--overwrite"]) == 2
    assert "is the current directory" in one_error_line(capsys)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert main(["run", *TINY, "--out", str(home)]) == 2
    assert "is your home directory" in one_error_line(capsys)
    assert main(["serve", "--workload", "mlp", "--device", "cpu", "--out", "/"]) == 2
    assert "is a filesystem root" in one_error_line(capsys)
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    assert main(["sweep", *TINY, "--out", str(tmp_path / "repo")]) == 2
    assert "root of a git repository" in one_error_line(capsys)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["home", "repo", "train.py"]


# ------------------------------------------------------------------------------------------------ one writer

def test_two_runs_into_one_out_one_succeeds_and_the_other_is_refused_naming_the_lock(tmp_path):
    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW_FORWARD)  # 20 ms a step: the first run holds the folder for seconds
    out = tmp_path / "run"
    command = [sys.executable, "-m", "perflab", "run", "--workload", f"{plugin}:build", "--device", "cpu", "--batch",
               "4", "--warmup", "1", "--steps", "400", "--trials", "1", "--out", str(out)]
    first = subprocess.Popen(command, cwd=tmp_path, env=perflab_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / LOCK_FILE).exists():
            assert time.time() < deadline and first.poll() is None, first.stderr.read()
            time.sleep(0.05)
        second = subprocess.run(command, cwd=tmp_path, env=perflab_env(), capture_output=True, text=True,
                                timeout=120)
        assert first.poll() is None, "the first run ended before the second tried: lengthen it"
        assert first.wait(timeout=120) == 0, first.stderr.read()
    finally:
        first.kill()
    assert second.returncode == 2
    err = second.stderr.strip()
    assert f"is in use by another perflab command (pid {first.pid} holds" in err and len(err.splitlines()) == 1
    assert json.loads((out / "result.json").read_text())["status"] == "complete"
    assert not (out / LOCK_FILE).exists()


def test_a_second_writer_is_refused_at_once_while_the_folder_is_locked(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    with out_lock(out):
        began = time.perf_counter()
        assert main(["sweep", *TINY, "--batch", "4,8", "--out", str(out)]) == 2
        assert f"pid {os.getpid()}" in one_error_line(capsys)
        assert main(["run", *TINY, "--out", str(out)]) == 2
        assert f"in use by another perflab command (pid {os.getpid()}" in one_error_line(capsys)
        assert time.perf_counter() - began < 10
    assert not (out / "sweep.jsonl").exists() and out.exists()


# ------------------------------------------------------------------------------------------------ --resume

def test_resuming_a_tune_with_another_workload_is_refused(tmp_path, capsys):
    out = tmp_path / "tune"
    (out / "trials").mkdir(parents=True)
    start = RunConfig(workload="mlp", device="cpu")
    row = {"index": 0, "key": "run-abc", "name": "00-start", "kind": "run", "label": "start", "dir": "trials/00-start",
           "status": "ok", "reason": "", "wall_s": 1.0, "config": start.to_dict()}
    (out / "tune.jsonl").write_text(json.dumps(row) + "\n")
    journal = (out / "tune.jsonl").read_text()
    assert main(["tune", "--resume", "--out", str(out), "--workload", "transformer", "--device", "cpu"]) == 2
    err = one_error_line(capsys)
    assert "--workload mlp -> transformer" in err and "another --out" in err
    assert (out / "tune.jsonl").read_text() == journal


def test_resuming_a_sweep_with_other_fixed_options_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", *TINY, "--batch", "4,8", "--out", str(out)]) == 0
    rows = (out / "sweep.jsonl").read_text()
    capsys.readouterr()
    assert main(["sweep", *TINY, "--batch", "4,8", "--seed", "3", "--resume", "--out", str(out)]) == 2
    assert "--seed 0 -> 3" in one_error_line(capsys)
    assert (out / "sweep.jsonl").read_text() == rows
    assert main(["sweep", *TINY, "--batch", "4,8", "--resume", "--out", str(out)]) == 0  # the same sweep resumes


# ------------------------------------------------------------------------------------------------ hangs

def test_an_absurd_serve_rate_is_refused_at_once(tmp_path, capsys):
    began = time.perf_counter()
    assert main(["serve", "--workload", "mlp", "--device", "cpu", "--qps", "1e9", "--out", str(tmp_path / "s")]) == 2
    assert "lower --qps" in one_error_line(capsys)
    assert time.perf_counter() - began < 5 and not (tmp_path / "s").exists()


def test_a_rate_far_beyond_capacity_ends_the_point_as_overloaded(tmp_path, capsys):
    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW_FORWARD)
    out = tmp_path / "serve"
    began = time.perf_counter()
    code = main(["serve", "--workload", f"{plugin}:build", "--device", "cpu", "--batcher-max-batch", "4",
                 "--warmup", "1", "--qps", "50000", "--duration", "2", "--out", str(out)])
    assert time.perf_counter() - began < 60  # the schedule alone is 100,000 queries: hours at ~200 queries/s
    assert code == 0
    point = json.loads((out / "result.json").read_text())["metrics"]["serve"]["points"][0]
    assert point["overloaded"]["unserved"] > 0 and not point["passed"]
    assert "overloaded" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--workers", "1000"], "--workers 1000 is more than 4x"),
    (["--nproc", "1000"], "--nproc 1000 on CPU starts 1000 gloo ranks"),
])
def test_process_counts_beyond_the_machine_are_refused(tmp_path, capsys, argv, message):
    assert main(["run", *TINY, *argv, "--out", str(tmp_path / "run")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()

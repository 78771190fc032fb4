"""What a workload's code does to the perflab process, and signals from outside, in real subprocesses: SIGTERM ends a
command as Ctrl-C does, os._exit(0) and sys.exit are one line and a non-zero exit, a plugin's threads cannot keep
perflab alive and its processes do not outlive the run, a rank's sys.exit is that rank's exit, and an offline serve
point cannot grow without bound."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perflab.errors import PerflabError
from perflab.results.rundir import LOCK_FILE, claim, out_lock
from perflab.serve.config import MAX_QUERIES_PER_POINT, check_offline_queries
from tests.cli_process import wait_for

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--workload", "mlp", "--device", "cpu", "--batch", "8", "--warmup", "1", "--option", "hidden=16",
        "--option", "in_features=8"]
PLUGIN = '''
import os, subprocess, sys, threading, time
import torch
from torch import nn
from torch.utils.data import TensorDataset
import perflab

class Model(nn.Module):
    def __init__(self, exit_in_forward):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.exit_in_forward = exit_in_forward

    def forward(self, x):
        if self.exit_in_forward == "all" or os.environ.get("RANK") == self.exit_in_forward:
            sys.exit(0)
        return self.linear(x)

def build(cfg):
    options = cfg.workload_options
    if options.get("exit") == "1":
        os._exit(0)
    if options.get("thread"):
        threading.Thread(target=time.sleep, args=(600,), name=options["thread"]).start()
    if options.get("sleep"):
        subprocess.Popen(["sleep", options["sleep"]])
        subprocess.Popen(["sh", "-c", "sleep " + options["sleep"] + " & exit 0"])  # a daemonised grandchild
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    return perflab.Workload(name="hostile", model=Model(options.get("exit_in_forward", "")), dataset=data,
                            loss_fn=nn.CrossEntropyLoss())
'''


def perflab_process(*argv: str, cwd: Path) -> subprocess.Popen:
    """`python -m perflab ARGV`, the process a user starts (its own signal handling and exit), one CPU thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("PERFLAB_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "perflab", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout_s)
    return process.returncode, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def plugin(tmp_path: Path) -> str:
    path = tmp_path / "hostile_plugin.py"
    path.write_text(PLUGIN)
    return f"{path}:build"


def test_sigterm_during_a_profile_keeps_an_interrupted_result_and_leaves_the_folder_reusable(tmp_path):
    out = tmp_path / "prof"
    process = perflab_process("profile", *TINY, "--steps", "100000", "--trials", "1", "--out", str(out), cwd=tmp_path)
    wait_for(out / "trace.json")
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    code, err = finished(process)
    assert code == 130 and "Traceback" not in err, err
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "interrupted" and "SIGTERM" in saved["status_reason"]
    assert not (out / LOCK_FILE).exists()
    assert "trace.json" in claim(out, overwrite=True)  # perflab's own files: --overwrite replaces them


def test_sigterm_during_a_run_keeps_an_interrupted_result(tmp_path):
    out = tmp_path / "run"
    process = perflab_process("run", *TINY, "--steps", "100000", "--trials", "1", "--checkpoint-every", "5",
                              "--out", str(out), cwd=tmp_path)
    wait_for(out / "checkpoint.pt")
    process.send_signal(signal.SIGTERM)
    code, err = finished(process)
    assert code == 130 and "Traceback" not in err, err
    assert json.loads((out / "result.json").read_text())["status"] == "interrupted"
    assert not (out / LOCK_FILE).exists()


def test_a_folder_holding_only_perflabs_own_files_is_offered_to_overwrite_not_called_the_users(tmp_path):
    (tmp_path / "trace.json").write_text("{}")  # a profile killed before it saved its result
    with pytest.raises(PerflabError, match="did not finish.*--overwrite"):
        claim(tmp_path, overwrite=False)
    assert list(claim(tmp_path, overwrite=True)) == ["trace.json"]
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PerflabError, match="perflab did not write \\(notes.txt\\)"):
        claim(tmp_path, overwrite=True)


def test_build_calling_os_exit_0_is_one_line_and_a_failure_and_leaves_nothing_locked(tmp_path):
    out = tmp_path / "exit"
    code, err = finished(perflab_process("run", "--workload", plugin(tmp_path), "--option", "exit=1", "--device", "cpu",
                                         "--out", str(out), cwd=tmp_path))
    assert code == 2
    assert "os._exit(0)" in one_line(err) and "hostile_plugin.py" in err
    assert not out.exists()  # created by this run, nothing kept: removed, lock and all


def test_sys_exit_in_forward_is_one_line_and_a_failure_not_a_silent_success(tmp_path):
    code, err = finished(perflab_process("run", "--workload", plugin(tmp_path), "--option", "exit_in_forward=all",
                                         "--device", "cpu", "--steps", "2", "--warmup", "1", "--trials", "1", "--out",
                                         str(tmp_path / "o"), cwd=tmp_path))
    assert code == 2 and "sys.exit(0)" in one_line(err) and "in forward" in err


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_note(tmp_path, capsys):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(f"{dead.pid}\n")
    with out_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    assert f"took over {tmp_path / LOCK_FILE}, left by pid {dead.pid}" in capsys.readouterr().err
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_plugin_thread_that_never_ends_does_not_keep_perflab_from_exiting(tmp_path):
    out = tmp_path / "threads"
    code, err = finished(perflab_process("run", "--workload", plugin(tmp_path), "--option", "thread=plugin-poller",
                                         "--device", "cpu", "--steps", "2", "--warmup", "1", "--trials", "1", "--out", str(out),
                                         cwd=tmp_path))
    assert code == 0 and (out / "result.json").is_file(), err
    assert "'plugin-poller'" in err and "exits without waiting" in err


def test_processes_a_plugin_starts_are_ended_with_the_run(tmp_path):
    seconds = f"{random.randint(1000, 9999)}.5"  # the plugin's sleeps are found by this argument
    out = tmp_path / "children"
    code, err = finished(perflab_process("run", "--workload", plugin(tmp_path), "--option", f"sleep={seconds}",
                                         "--device", "cpu", "--steps", "2", "--warmup", "1", "--trials", "1", "--out", str(out),
                                         cwd=tmp_path))
    assert code == 0 and (out / "result.json").is_file(), err
    assert "ended 2 process(es)" in err and "(sleep)" in err
    assert sleeping(seconds) == [], "a process the plugin started outlived perflab"


def sleeping(seconds: str) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command[:2] == [b"sleep", seconds.encode()]:
            found.append(int(entry.name))
    return found


def test_a_rank_that_calls_sys_exit_is_reported_as_that_ranks_exit(tmp_path):
    code, err = finished(perflab_process("run", "--workload", plugin(tmp_path), "--option", "exit_in_forward=1",
                                         "--device", "cpu", "--nproc", "2", "--steps", "2", "--warmup", "1", "--trials", "1",
                                         "--out", str(tmp_path / "ranks"), cwd=tmp_path), timeout_s=120)
    assert code == 2
    line = one_line(err)
    assert line.startswith("error: rank 1: your code called sys.exit(0)") and "in forward" in line
    assert "SystemExit" not in err


def test_offline_serve_refuses_a_duration_past_a_day_before_loading_anything(tmp_path):
    code, err = finished(perflab_process("serve", "--workload", "mlp", "--device", "cpu", "--scenario", "offline",
                                         "--duration", "1e9", "--out", str(tmp_path / "serve"), cwd=tmp_path))
    assert code == 2 and "--duration must be a positive number up to 86400" in one_line(err)


def test_an_offline_point_past_the_query_limit_is_refused_with_the_longest_duration_that_fits():
    check_offline_queries(MAX_QUERIES_PER_POINT, 1000.0, 1800)
    with pytest.raises(PerflabError, match="use --duration 2 or less"):
        check_offline_queries(MAX_QUERIES_PER_POINT * 2, 1e6, 4)

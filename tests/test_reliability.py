"""Nothing lost, nothing stale, nothing silently wrong: interrupts, --out, diverged models, busy machines."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import perflab
from perflab.cli import main
from perflab.compare import compare_results
from perflab.config import RunConfig
from perflab.harness.interference import LoadProbe
from perflab.ranks import LAUNCHER_PID_ENV
from perflab.results import Result
from tests.cli_process import wait_for


TINY = ["--workload", "mlp", "--device", "cpu", "--batch", "8", "--warmup", "1", "--option", "hidden=16",
        "--option", "in_features=8"]
NAN_PLUGIN = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
import perflab

def build(cfg):
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    return perflab.Workload(name="nan", model=model, dataset=data, loss_fn=nn.CrossEntropyLoss())
'''
SMALL_DATASET = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
import perflab

def build(cfg):
    data = TensorDataset(torch.randn(3, 4), torch.randint(0, 2, (3,)))
    repeat = cfg.workload_options.get("repeat") == "1"
    return perflab.Workload(name="small", model=nn.Linear(4, 2), dataset=data, loss_fn=nn.CrossEntropyLoss(),
                            repeat_items=repeat)
'''


def perflab_process(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perflab", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_ctrl_c_keeps_checkpoints_marks_the_run_interrupted_and_it_resumes_in_place(tmp_path):
    out = tmp_path / "ck"
    proc = perflab_process("run", *TINY, "--steps", "200000", "--trials", "1", "--checkpoint-every", "5",
                           "--out", str(out), cwd=tmp_path)
    wait_for(out / "checkpoint.pt")
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert (out / "checkpoint.pt").is_file()
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "interrupted" and "after 0 of 1 trials" in saved["status_reason"]
    assert "--resume-from" in err and "Traceback" not in err
    resumed = subprocess.run([sys.executable, "-m", "perflab", "run", *TINY, "--steps", "3", "--trials", "1",
                              "--resume-from", str(out), "--out", str(out)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "complete" and result["timing"]["checkpoint"]["resumed_at_step"] >= 5


def test_out_holding_a_run_is_refused_unless_overwrite_which_empties_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(out)]) == 0
    (out / "trace.json").write_text("{}")  # an artifact of the earlier run
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(out)]) == 2
    assert "already holds a perflab output (result.json)" in capsys.readouterr().err
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "trace.json").exists() and (out / "result.json").exists()


def test_overwrite_never_empties_a_folder_perflab_did_not_write(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("precious")
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(tmp_path), "--overwrite"]) == 2
    assert "perflab did not write" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_temp_files_of_a_killed_write_are_removed_on_the_next_use(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".result.json.abc123.tmp").write_text("{half")
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(out)]) == 0
    assert not list(out.glob(".*.tmp"))


def test_a_diverged_model_is_marked_invalid_and_exits_1(tmp_path, capsys):
    plugin = tmp_path / "nan_model.py"
    plugin.write_text(NAN_PLUGIN)
    out = tmp_path / "run"
    code = main(["run", "--workload", f"{plugin}:build", "--device", "cpu", "--batch", "8", "--steps", "2",
                 "--trials", "1", "--warmup", "1", "--out", str(out)])
    assert code == 1
    assert "invalid run" in capsys.readouterr().err
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "invalid" and "NaN/inf" in saved["status_reason"]


def test_a_sweep_never_names_an_invalid_point_best(tmp_path):
    plugin = tmp_path / "nan_model.py"
    plugin.write_text(NAN_PLUGIN)
    out = tmp_path / "sweep"
    code = main(["sweep", "--workload", f"{plugin}:build,mlp", "--device", "cpu", "--batch", "8", "--steps", "2",
                 "--trials", "1", "--warmup", "1", "--out", str(out)])
    assert code == 1  # one point diverged
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    statuses = {row["params"].get("workload", row["config"]["workload"]).split("/")[-1]: row["status"]
                for row in rows}
    assert statuses["mlp"] == "ok" and any(status == "invalid" for status in statuses.values())
    meta = json.loads((out / "sweep.json").read_text())
    best = next(row for row in rows if row["key"] == meta["best"])
    assert best["status"] == "ok"


def test_sweep_with_an_unknown_workload_fails_before_any_point(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--workload", "nosuch,mlp", "--device", "cpu", "--steps", "2", "--out", str(out)]) == 2
    assert "unknown workload 'nosuch'" in capsys.readouterr().err
    assert not (out / "sweep.jsonl").exists()


@pytest.mark.parametrize("option, message", [
    ("hidden=abc", "mlp: --option hidden must be an integer, got 'abc'"),
    ("nokey=3", "mlp has no option 'nokey'; its options: in_features"),
    ("hidden=0", "mlp: --option hidden must be a positive integer"),
])
def test_workload_options_are_checked_against_the_workload_declaration(option, message, tmp_path, capsys):
    assert main(["run", "--workload", "mlp", "--device", "cpu", "--steps", "1", "--option", option,
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_workloads_command_lists_each_workloads_options(capsys, monkeypatch):
    from perflab import cli
    monkeypatch.setattr(cli.console, "width", 200)
    assert main(["workloads"]) == 0
    listing = capsys.readouterr().out
    assert "image_res (int >= 16, default 224 on CUDA, 64 on CPU)" in listing and "seq_len" in listing


def test_a_dataset_smaller_than_a_batch_is_refused_or_repeated_with_a_note(tmp_path, capsys):
    plugin = tmp_path / "small.py"
    plugin.write_text(SMALL_DATASET)
    args = ["run", "--workload", f"{plugin}:build", "--device", "cpu", "--batch", "8", "--steps", "1",
            "--trials", "1", "--warmup", "0"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    assert "has 3 items, fewer than one batch of 8" in capsys.readouterr().err
    assert main([*args, "--option", "repeat=1", "--out", str(tmp_path / "b")]) == 0
    notes = json.loads((tmp_path / "b" / "result.json").read_text())["notes"]
    assert any("items repeat within each batch" in note for note in notes)


def _spin_outside_our_process_tree(seconds: float) -> int:
    """A busy loop re-parented to init (not our child), as another user's process would be."""
    script = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    launcher = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{script}" >/dev/null 2>&1 & echo $!'],
                              capture_output=True, text=True, check=True)
    return int(launcher.stdout.strip())


def test_load_probe_sees_another_process_busy_during_a_trial():
    pid = _spin_outside_our_process_tree(3.0)
    try:
        probe = LoadProbe(None)
        time.sleep(0.3)
        probe.begin()
        time.sleep(1.0)
        load = probe.end()
    finally:
        os.kill(pid, signal.SIGKILL)
    assert load.other_cpu_cores is not None and load.other_cpu_cores > 0.5 and load.busy


@pytest.mark.parametrize("other_ticks,busy", [(2, False), (6, True)])
def test_a_20_ms_trial_is_not_called_busy_on_the_two_ticks_a_tick_counter_can_misread(monkeypatch, other_ticks,
                                                                                         busy):
    from perflab.harness import interference
    totals = iter([1000, 1000 + other_ticks])
    clock = iter([50.0, 50.02])
    monkeypatch.setattr(interference, "_total_busy_ticks", lambda cpus=None: next(totals))
    monkeypatch.setattr(interference, "_processes", lambda: {})
    monkeypatch.setattr(interference, "runnable_tasks", lambda: None)  # the tick count alone: not this machine's
    monkeypatch.setattr(interference, "run_queue_wait_ns", lambda: None)  # other signals, whatever runs beside
    monkeypatch.setattr(interference.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(interference, "CLOCK_TICKS", 100)
    probe = LoadProbe(None)
    probe.begin()
    load = probe.end()
    assert load.busy is busy
    assert load.other_cpu_cores == pytest.approx(max(0, other_ticks - 2) / 100 / 0.02)


PROC_STAT = """cpu  300 0 100 900 0 0 0 0 0 0
cpu0 20 0 10 470 0 0 0 0 0 0
cpu1 280 0 90 430 0 0 0 0 0 0
intr 1 2 3
"""


def test_busy_ticks_count_only_the_cpus_this_run_may_use():
    from perflab.harness.interference import busy_ticks_of
    assert busy_ticks_of(PROC_STAT) == 400  # all CPUs: the first line's user + system
    assert busy_ticks_of(PROC_STAT, {0}) == 30  # pinned to cpu0: a neighbour spinning on cpu1 is not its concern
    assert busy_ticks_of(PROC_STAT, {0, 1}) == 400
    assert busy_ticks_of("intr 1 2\n") is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may use")
def test_a_probe_pinned_to_a_busy_core_sees_the_neighbour_there():
    core = sorted(os.sched_getaffinity(0))[1]
    spinner = subprocess.Popen([sys.executable, "-c", f"import os, time\nos.sched_setaffinity(0, {{{core}}})\n"
                                "end = time.time() + 6\nwhile time.time() < end: pass"])
    probe = ("import os, time\nfrom perflab.harness.interference import LoadProbe\n"
             f"os.sched_setaffinity(0, {{{core}}})\nprobe = LoadProbe(None)\nassert probe.cpus == {{{core}}}\n"
             "probe.begin()\ntime.sleep(1.0)\nprint(probe.end().other_cpu_cores)")
    try:
        time.sleep(0.3)
        seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    finally:
        spinner.kill()
    assert seen.returncode == 0, seen.stderr[-1500:]
    assert float(seen.stdout.split()[-1]) > 0.5


def test_short_trials_each_too_short_to_tell_still_make_a_busy_run_together():
    from perflab.harness.interference import TrialLoad, summarize_load
    # three 20-ms trials with 3 ticks of other work each: 0.5 cores apiece after the count's uncertainty (not over
    # the threshold), 1.2 cores together
    loads = [TrialLoad(0.5, 0.0, [], other_ticks=3, seconds=0.02) for _ in range(3)]
    assert not any(load.busy for load in loads)
    record = summarize_load(loads)
    assert record.busy and record.busy_trials == [0, 1, 2]
    assert record.other_cpu_cores_max == pytest.approx((9 - 2) / 100 / 0.06)
    quiet = summarize_load([TrialLoad(0.0, 0.0, [], other_ticks=1, seconds=0.02) for _ in range(3)])
    assert not quiet.busy


def test_load_probe_in_a_rank_counts_its_sibling_ranks_as_this_runs_own_work(monkeypatch, tmp_path):
    # a launcher outside our process tree with a busy "rank" under it: seen from another rank of the same launcher,
    # that is not other work (tune --nproc 2 had every trial "not judged": each rank saw the other spinning)
    script = tmp_path / "launcher.py"
    script.write_text("import subprocess, sys, time\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time\\nend = time.time() + 4\\n"
                      "while time.time() < end: pass'])\n"
                      "time.sleep(5)\n")
    started = subprocess.run(["sh", "-c", f'"{sys.executable}" "{script}" >/dev/null 2>&1 & echo $!'],
                             capture_output=True, text=True, check=True)
    launcher = int(started.stdout.strip())
    try:
        time.sleep(0.5)
        monkeypatch.setenv(LAUNCHER_PID_ENV, str(launcher))
        probe = LoadProbe(None)
        probe.begin()
        time.sleep(1.0)
        in_the_launchers_job = probe.end()
        monkeypatch.delenv(LAUNCHER_PID_ENV)
        probe.begin()
        time.sleep(1.0)
        outside_it = probe.end()
    finally:
        os.kill(launcher, signal.SIGKILL)  # its spinning child ends by itself within 4 s
    # the spinning rank's core is counted only from outside the job (whatever else the machine runs meanwhile)
    assert outside_it.other_cpu_cores - in_the_launchers_job.other_cpu_cores > 0.6
    assert outside_it.busy


def test_compare_declines_to_judge_contaminated_runs_unless_told(tmp_path):
    cfg = RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=3, warmup=1,
                    workload_options={"hidden": "16", "in_features": "8"})
    base = perflab.run("mlp", cfg)
    base.metrics.interference.busy = False  # whatever this test machine was doing
    for trial, throughput in zip(base.trials, (1000.0, 1010.0, 990.0)):
        trial.throughput_samples_per_s = throughput
    base.metrics.throughput_samples_per_s.median = 1000.0
    cand = Result.from_dict(base.to_dict())
    for trial in cand.trials:
        trial.throughput_samples_per_s *= 3  # a large, consistent change
    cand.metrics.throughput_samples_per_s.median *= 3
    cand.metrics.interference = dataclasses.replace(cand.metrics.interference, busy=True, other_cpu_cores_max=1.0)
    judged = compare_results(base, cand)
    assert judged.decision == "not judged" and "busy machine" in judged.reasons[0]
    assert compare_results(base, cand, accept_noisy=True).decision == "accept"


def fast_measurements(monkeypatch, bf16_tflops: float = 0.001) -> None:
    """The calibration's bookkeeping under test, not this CPU's matmul speed: fixed measurements."""
    from perflab import calibrate as cal
    monkeypatch.setattr(cal, "measure_matmul_tflops",
                        lambda device, precision, size: {"fp32": 0.05, "bf16": bf16_tflops}[precision])
    monkeypatch.setattr(cal, "measure_copy_gbps", lambda device, megabytes: 10.0)


def test_quick_calibration_never_replaces_a_full_one(monkeypatch, tmp_path):
    from perflab import calibrate as cal
    import torch
    fast_measurements(monkeypatch)
    full = cal.calibrate(torch.device("cpu"), quick=False)
    assert full["cache"].startswith("cached")
    quick = cal.calibrate(torch.device("cpu"), quick=True)
    assert quick["cache"].startswith("kept the full calibration")
    assert cal.cached_ceilings(torch.device("cpu"))["quick"] is False


def test_calibrate_prints_its_figures_when_the_cache_is_not_writable(monkeypatch, tmp_path, capsys):
    blocked = tmp_path / "ro"
    blocked.write_text("a file where a directory should be")
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(blocked))
    fast_measurements(monkeypatch)
    assert main(["calibrate", "--device", "cpu", "--quick"]) == 2
    out, err = capsys.readouterr()
    assert "matmul fp32" in out and "not cached" in err


def test_report_to_an_unwritable_place_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--steps", "2", "--trials", "1", "--out", str(out)]) == 0
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["report", str(out), "--out", str(blocked / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write the report") and len(err.splitlines()) == 1


def test_a_cpu_without_fast_bf16_records_it_as_not_supported_and_mfu_is_not_faked(monkeypatch, tmp_path):
    from perflab import calibrate as cal
    import torch
    fast_measurements(monkeypatch, bf16_tflops=0.004)
    entry = cal.calibrate(torch.device("cpu"), quick=True)
    assert entry["tflops"]["bf16"] is None and "no fast bf16" in entry["unsupported"]["bf16"]
    peak, source = cal.peak_tflops(torch.device("cpu"), "bf16")
    assert peak is None and source.startswith("not supported here")
    result = perflab.run("mlp", RunConfig(workload="mlp", device="cpu", batch_size=8, steps=2, trials=1, warmup=1,
                                          precision="bf16", check_quality=False,
                                          workload_options={"hidden": "16", "in_features": "8"}))
    assert result.metrics.flops.mfu_pct is None


def test_mfu_is_not_shown_against_a_peak_the_run_exceeds():
    from perflab.harness.runner import _flops
    import torch
    from unittest import mock
    with mock.patch("perflab.harness.runner.peak_tflops", return_value=(0.001, "calibrated")):
        flops = _flops(1e9, 1e6, torch.device("cpu"), RunConfig(precision="bf16"))
    assert flops.mfu_pct is None and flops.note.startswith("ceiling too low: recalibrate")


def test_nvml_finds_torchs_device_by_uuid_so_a_hidden_gpu_is_not_read_in_its_place(monkeypatch):
    # CUDA_VISIBLE_DEVICES=2: torch's device 0 is the host's third GPU; NVML index 0 would be a neighbour's card
    import types
    from perflab.harness import nvml

    class FakeNvml:
        NVMLError = RuntimeError

        @staticmethod
        def nvmlDeviceGetHandleByUUID(uuid):
            return ("by uuid", uuid)

        @staticmethod
        def nvmlDeviceGetHandleByIndex(index):
            return ("by index", index)
    monkeypatch.setattr(nvml, "pynvml", FakeNvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="5e1f-77"))
    assert nvml.device_handle(0) == ("by uuid", "GPU-5e1f-77")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda index: index + 2, raising=False)
    assert nvml.device_handle(0) == ("by index", 2)


def test_other_tasks_runnable_through_a_trial_or_a_long_wait_for_a_cpu_make_it_busy():
    # a trial of a few ms can run whole on one core while two spinners share the other: no tick and no wait of this
    # process shows them, but both stay runnable at either end of the trial
    from perflab.harness.interference import TrialLoad, summarize_load
    assert TrialLoad(0.0, 0.0, others_runnable=2).busy
    assert not TrialLoad(0.0, 0.0, others_runnable=1).busy  # a kernel thread's moment
    assert TrialLoad(0.0, 0.0, run_queue_wait_share=0.5).busy
    assert not TrialLoad(0.0, 0.0, run_queue_wait_share=0.1).busy
    record = summarize_load([TrialLoad(0.0, 0.0, others_runnable=3, seconds=0.01)])
    assert record.busy and record.others_runnable_max == 3


@pytest.mark.parametrize("sibling_ticks,counted", [(0, True), (3, False)])
def test_a_wait_for_a_cpu_while_a_sibling_rank_ran_is_not_called_other_work(monkeypatch, sibling_ticks, counted):
    # tune --nproc 2 on 2 cores: each rank waited ~40% of a trial for the other rank, and every trial read "busy"
    from perflab.harness import interference
    me, sibling, launcher = os.getpid(), 424242, 424241
    tables = iter([{me: (launcher, 100), sibling: (launcher, 50), launcher: (1, 5)},
                   {me: (launcher, 150), sibling: (launcher, 50 + sibling_ticks), launcher: (1, 5)}])
    monkeypatch.setenv(LAUNCHER_PID_ENV, str(launcher))
    monkeypatch.setattr(interference, "_processes", lambda: next(tables))
    monkeypatch.setattr(interference, "_total_busy_ticks", lambda cpus=None: None)
    monkeypatch.setattr(interference, "runnable_tasks", lambda: None)
    waits = iter([0, 500_000_000])  # half of a 1-s trial spent waiting for a CPU
    monkeypatch.setattr(interference, "run_queue_wait_ns", lambda: next(waits))
    clock = iter([10.0, 11.0])
    monkeypatch.setattr(interference.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(interference, "CLOCK_TICKS", 100)
    monkeypatch.setattr(interference, "gpu_neighbours", lambda index, own: [])
    probe = LoadProbe(None)
    probe.cores, probe.cpus = 4, None
    probe.begin()
    load = probe.end()
    assert (load.run_queue_wait_share is not None) is counted
    assert load.busy is counted

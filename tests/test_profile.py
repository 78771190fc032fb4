"""perflab profile: scheduled capture to a Chrome trace, the nsys command, the CUDA profiler range, markers off."""
from __future__ import annotations

import json

import pytest

from perflab import RunConfig
from perflab.cli import main
from perflab.diagnose.trace import load_trace
from perflab.errors import PerflabError
from perflab.hooks import StepHook
from perflab.pipeline import resolve_config, run
from perflab.profile.capture import CaptureOptions, ProfilerCapture
from perflab.profile.nsys import CudaProfilerRange, nsys_command, parse_range


def test_profile_command_saves_result_trace_diagnosis_and_nsys_command(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["profile", "--workload", "mlp", "--device", "cpu", "--batch", "8", "--steps", "4", "--trials", "1",
                 "--warmup", "1", "--wait", "1", "--warmup-steps", "1", "--active", "2", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["artifacts"]["trace"] == "trace.json"
    assert result["diagnosis"]["bottleneck"] == json.loads((out / "diagnosis.json").read_text())["bottleneck"]
    assert (out / "nsys_command.txt").read_text().startswith("nsys profile -t cuda,nvtx,osrt "
                                                             "--capture-range=cudaProfilerApi")
    assert "diagnosis:" in capsys.readouterr().out
    trace = load_trace(out / "trace.json")
    step_names = {trace.annotations.names[i] for i in trace.annotations.name_id}
    assert {"forward", "backward", "optimizer", "data"} <= step_names
    assert len([name for name in step_names if name.startswith("ProfilerStep#")]) == 2  # --active 2


def test_profile_refuses_a_schedule_longer_than_the_trial(tmp_path, capsys):
    code = main(["profile", "--workload", "mlp", "--device", "cpu", "--steps", "3", "--active", "3",
                 "--out", str(tmp_path / "run")])
    assert code == 2
    assert "fewer than the profiler schedule needs" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_capture_writes_gzipped_trace_when_asked(tmp_path):
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=1, warmup=0), None)
    capture = ProfilerCapture(tmp_path, CaptureOptions(wait=0, warmup=1, active=2, gzip=True))
    result = run("mlp", cfg, hooks=[capture])
    assert result.artifacts["trace"] == "trace.json.gz"
    assert len(load_trace(tmp_path / "trace.json.gz").cpu_ops) > 0


def test_nsys_command_reruns_the_same_options_with_the_profiler_range(tmp_path):
    cfg = RunConfig(workload="driving", batch_size=16, nsys="1:2", out="x")
    command = nsys_command(tmp_path, cfg, skip=3, active=4)
    assert command[:6] == ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
                           "--capture-range-end=stop"]
    tail = command[command.index("perflab"):]
    assert tail == ["perflab", "run", "--batch", "16", "--out", str(tmp_path / "nsys_run"), "--nsys", "3:4"]


def test_nsys_command_of_a_profiled_run_keeps_its_levers(tmp_path):
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=4, steps=3, trials=1, warmup=2,
                                   compile="default", channels_last=False, precision="bf16"), None)
    command = nsys_command(tmp_path, cfg.replace(channels_last=True), skip=1, active=1)
    run_part = command[command.index("run"):]
    assert ["--compile", "default"] == run_part[run_part.index("--compile"):run_part.index("--compile") + 2]
    assert "--channels-last" in run_part and ["--precision", "bf16"] == \
        run_part[run_part.index("--precision"):run_part.index("--precision") + 2]


def test_library_profile_writes_the_nsys_command_with_every_lever(tmp_path):
    from perflab.pipeline import profile_run
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8, steps=4, trials=1, warmup=1,
                                   optimizer_impl="foreach", workers=1), None)
    profile_run("mlp", cfg, tmp_path, CaptureOptions(wait=0, warmup=1, active=1))
    written = (tmp_path / "nsys_command.txt").read_text()
    assert "--optimizer-impl foreach" in written and "--workers 1" in written


def test_profile_honours_checkpoint_every(tmp_path):
    out = tmp_path / "run"
    code = main(["profile", "--workload", "mlp", "--device", "cpu", "--batch", "8", "--steps", "5", "--trials", "1",
                 "--warmup", "1", "--wait", "0", "--warmup-steps", "1", "--active", "1", "--checkpoint-every", "5",
                 "--out", str(out)])
    assert code == 0
    assert (out / "checkpoint.pt").is_file()
    assert json.loads((out / "result.json").read_text())["timing"]["checkpoint"]["saves"] == 1


def test_library_run_honours_checkpoint_fields_and_needs_a_directory_for_them(tmp_path):
    cfg = RunConfig(workload="mlp", device="cpu", batch_size=8, steps=2, trials=1, warmup=0, checkpoint_every=2)
    with pytest.raises(PerflabError, match="RunConfig.out"):
        run("mlp", cfg)
    result = run("mlp", cfg.replace(out=str(tmp_path)))
    assert (tmp_path / "checkpoint.pt").is_file() and result.timing["checkpoint"]["saves"] == 1
    resumed = run("mlp", cfg.replace(checkpoint_every=None, resume_from=str(tmp_path)))
    assert resumed.timing["checkpoint"]["resumed_at_step"] == 2


def test_nsys_range_must_be_skip_colon_active():
    assert parse_range("2:3") == (2, 3)
    with pytest.raises(PerflabError, match="SKIP:ACTIVE"):
        parse_range("3")


def test_cuda_profiler_range_is_a_noted_no_op_on_cpu():
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=1, warmup=0), None)
    result = run("mlp", cfg, hooks=[CudaProfilerRange(1, 1)])
    assert any("--nsys" in note and "CPU" in note for note in result.notes)


@pytest.mark.cuda
def test_cuda_profiler_range_opens_and_closes_on_cuda():
    cfg = resolve_config(RunConfig(workload="mlp", device="cuda", steps=4, trials=1, warmup=1), None)
    hook = CudaProfilerRange(1, 2)
    run("mlp", cfg, hooks=[hook])
    assert hook.recorded == 2 and not hook.running


class MarkersOff(StepHook):
    def start(self, plan) -> None:
        plan.markers = False


def test_markers_switched_off_leave_no_phase_ranges_in_the_trace(tmp_path):
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8, steps=3, trials=1, warmup=0), None)
    run("mlp", cfg, hooks=[MarkersOff(), ProfilerCapture(tmp_path, CaptureOptions(wait=0, warmup=1, active=2))])
    trace = load_trace(tmp_path / "trace.json")
    assert "forward" not in trace.annotations.names and len(trace.cpu_ops) > 0


def test_profile_on_cpu_prints_no_kineto_noise_and_writes_every_file_with_one_mode(tmp_path):
    import os
    import stat
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if key != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    completed = subprocess.run(
        [sys.executable, "-m", "perflab", "profile", "--workload", "mlp", "--device", "cpu", "--batch", "8",
         "--steps", "4", "--trials", "1", "--warmup", "1", "--wait", "1", "--warmup-steps", "1", "--active", "2",
         "--out", str(out)], capture_output=True, text=True, env=env, timeout=300,
        preexec_fn=lambda: os.umask(0o022))
    assert completed.returncode == 0, completed.stderr
    assert "gpuGetDeviceCount" not in completed.stderr + completed.stdout
    assert "ERROR:" not in completed.stderr and "USDT:" not in completed.stderr
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in out.iterdir()}
    assert {"result.json", "diagnosis.json", "trace.json", "nsys_command.txt"} <= set(modes)
    assert set(modes.values()) == {0o644}, modes


def test_a_profile_run_is_titled_as_a_profile(tmp_path):
    import shutil
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "traces" / "cpu" / "compute__big_matmul.result.json"
    shutil.copy(fixture, tmp_path / "result.json")
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# perflab profile: ")
    assert "<title>perflab profile: " in (tmp_path / "report.html").read_text()


def test_a_loader_fed_profile_traces_whole_cycles_of_its_workers(tmp_path, capsys):
    # 3 traced steps of a 2-worker loader become 4: whole cycles of the round robin (steps raised to fit)
    out = tmp_path / "run"
    code = main(["profile", "--workload", "mlp", "--device", "cpu", "--batch", "8", "--steps", "5", "--trials", "1",
                 "--warmup", "1", "--workers", "2", "--data", "loader", "--wait", "1", "--warmup-steps", "1",
                 "--active", "3", "--out", str(out)])
    assert code == 0, capsys.readouterr()
    result = json.loads((out / "result.json").read_text())
    assert any("the trace records 4 steps, not --active 3: whole cycles of the 2 DataLoader workers" in note
               for note in result["notes"])
    trace = load_trace(out / "trace.json")
    steps = {trace.annotations.names[i] for i in trace.annotations.name_id if
             trace.annotations.names[i].startswith("ProfilerStep#")}
    assert len(steps) == 4
    assert result["config"]["steps"] == 6  # wait 1 + warm-up 1 + active 4


def test_whole_loader_cycles_leave_a_schedule_alone_without_workers_or_when_already_whole():
    from perflab.profile.capture import whole_loader_cycles
    options = CaptureOptions(active=3)
    assert whole_loader_cycles(options, 0) == (options, None)
    assert whole_loader_cycles(options, 1) == (options, None)
    assert whole_loader_cycles(CaptureOptions(active=16), 8)[1] is None
    rounded, note = whole_loader_cycles(options, 16)
    assert rounded.active == 16 and "16 DataLoader workers" in note

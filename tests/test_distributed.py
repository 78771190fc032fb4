"""Distributed runs: --nproc through torchrun's launcher (gloo on CPU), gathering, scaling, faults, and the
communication analysis behind the collectives rule.

Each launch starts real rank processes (5-10 s on a small machine), so only two tests launch ranks; the rest
check the pieces without processes.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from perflab.cli import main
from perflab.config import RunConfig
from perflab.diagnose import diagnose
from perflab.diagnose.trace import load_trace
from perflab.diagnose.communication import communication_profile, is_nccl_kernel
from perflab.distributed.launch import check_launch, rank_failure, torchrun_argv
from perflab.sweep import SweepPoint
from perflab.sweep.scale import at_rank_counts, scaling_rows, single_rank
from perflab.errors import PerflabError
from perflab.step.data import first_batches, make_loader
from perflab.harness.loop import run_steps
from perflab.levers.plan import build_plan
from perflab.harness.steady import reach_steady_state
from perflab.step.timers import NullTimer
from perflab.workloads import load_workload

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--workload", "mlp", "--option", "in_features=32", "--option", "hidden=16", "--batch", "8",
        "--steps", "3", "--warmup", "1", "--trials", "2", "--device", "cpu"]
FAILS_ON_RANK1 = "tests/planted/fails_on_rank1.py:build"


# ---------------------------------------------------------------------------------------------- communication

def _chrome_trace(path: Path, steps: int, step_us: float, compute: tuple, nccl: tuple, nccl_name: str) -> Path:
    """A GPU trace of `steps` steps: per step one compute kernel and one NCCL kernel at the given offsets."""
    events = []
    for step in range(steps):
        t0 = step * step_us
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t0,
                       "dur": step_us, "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": t0 + compute[0],
                       "dur": compute[1] - compute[0], "pid": 0, "tid": 7, "args": {"stream": 7}})
        events.append({"ph": "X", "cat": "kernel", "name": nccl_name, "ts": t0 + nccl[0], "dur": nccl[1] - nccl[0],
                       "pid": 0, "tid": 20, "args": {"stream": 20}})
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "H200"}]}))
    return path


def test_nccl_kernels_are_matched_by_prefix_whatever_the_nccl_version():
    for name in ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "void ncclKernel_ReduceScatter_RING",
                 "ncclDevKernel_Generic_4", "nccl:all_reduce"):
        assert is_nccl_kernel(name), name
    for name in ("ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>",
                 "triton_poi_fused_add_0", "Memcpy HtoD (Pageable -> Device)"):
        assert not is_nccl_kernel(name), name


def test_exposed_communication_is_nccl_time_not_under_compute(tmp_path):
    # per 10 ms step: compute 0-4 ms, NCCL 3-7 ms -> 4 ms of communication, 1 ms overlapped, 3 ms exposed
    trace = _chrome_trace(tmp_path / "t.json", 3, 10_000, (0, 4_000), (3_000, 7_000),
                          "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    profile = communication_profile(load_trace(trace))
    assert profile.steps == 3
    assert profile.communication_ms_per_step == pytest.approx(4.0)
    assert profile.overlapped_ms_per_step == pytest.approx(1.0)
    assert profile.exposed_ms_per_step == pytest.approx(3.0)
    assert profile.overlap_pct == pytest.approx(25.0)
    assert profile.exposed_share_pct == pytest.approx(30.0)
    assert list(profile.top_collectives) == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]


def test_collectives_rule_names_exposed_communication_and_proposes_ddp_levers(tmp_path):
    trace = _chrome_trace(tmp_path / "exposed.json", 3, 10_000, (0, 4_000), (3_000, 7_000), "ncclDevKernel_AllReduce")
    found = {finding.cls: finding for finding in diagnose(trace).findings}
    collectives = found["collectives"]
    assert collectives.evidence["exposed_communication_pct_of_step"] == pytest.approx(30.0)
    assert collectives.levers[:3] == ["ddp-bucket-size", "gradient-as-bucket-view", "static-graph"]
    assert "grad-accum" in collectives.levers and "bf16-comm-hook" in collectives.levers


def test_collectives_rule_is_quiet_when_communication_hides_under_compute(tmp_path):
    trace = _chrome_trace(tmp_path / "hidden.json", 3, 10_000, (0, 8_000), (2_000, 7_000), "ncclKernel_AllReduce")
    assert "collectives" not in {finding.cls for finding in diagnose(trace).findings}


# ---------------------------------------------------------------------------------------------- pieces

def test_rank_shards_together_make_up_the_global_batch():
    dataset = torch.utils.data.TensorDataset(torch.arange(64.0))
    single = first_batches(make_loader(dataset, 16, 0, False, False, None, None, seed=3), 3)
    shards = [first_batches(make_loader(dataset, 8, 0, False, False, None, None, 3, (rank, 2)), 3)
              for rank in range(2)]
    for step in range(3):
        together = torch.cat([shards[0][step][0], shards[1][step][0]])
        assert sorted(together.tolist()) == sorted(single[step][0].tolist())
        assert not set(shards[0][step][0].tolist()) & set(shards[1][step][0].tolist())


def test_grad_accum_steps_the_optimizer_once_every_n_steps():
    cfg = RunConfig(workload="mlp", device="cpu", batch_size=4, grad_accum=3,
                    workload_options={"in_features": "8", "hidden": "4"})
    plan = build_plan(load_workload("mlp", cfg), cfg, torch.device("cpu"))
    steps = []
    original = plan.optimizer.step
    plan.optimizer.step = lambda *a, **k: steps.append(plan.micro_step) or original(*a, **k)
    run_steps(plan, plan.batches(0), 7, NullTimer())
    assert steps == [3, 6]
    assert "grad-accum" in plan.levers


def test_steady_state_runs_as_many_windows_as_the_ranks_agree_on():
    cfg = RunConfig(workload="mlp", device="cpu", batch_size=4, workload_options={"in_features": "8", "hidden": "4"})
    plan = build_plan(load_workload("mlp", cfg), cfg, torch.device("cpu"))
    asked = []
    steady = reach_steady_state(plan, plan.batches(0), 4, lambda: None, agree=lambda stop: asked.append(stop) or
                                len(asked) == 3)
    assert steady["steps"] == 3 * 4 and len(steady["window_step_ms"]) == 3


@pytest.mark.parametrize("changes, message", [
    (dict(ddp_bucket_mb=25.0), "needs --nproc 2 or more"),
    (dict(parallel="fsdp"), "needs --nproc 2 or more"),
    (dict(nproc=2, parallel="fsdp", static_graph=True), "is a DDP setting"),
    (dict(nproc=2, nnodes=2), "add --rdzv-endpoint"),
    (dict(nproc=2, cuda_graphs=True, device="cuda"), "drop --cuda-graphs"),
])
def test_distributed_settings_are_refused_where_they_cannot_act(changes, message):
    with pytest.raises(PerflabError, match=message):
        RunConfig(**changes).validate()


def test_multi_node_flags_pass_through_to_torchrun():
    cfg = RunConfig(nproc=8, nnodes=2, node_rank=1, rdzv_endpoint="node0:29500")
    argv = torchrun_argv(cfg, "/tmp/logs")
    assert argv[argv.index("--nproc-per-node") + 1] == "8" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node0:29500" and argv[argv.index("--node-rank") + 1] == "1"
    assert "--standalone" in torchrun_argv(RunConfig(nproc=2), "/tmp/logs")


def test_scaling_efficiency_is_throughput_over_n_times_one_rank():
    points = [SweepPoint(status="ok", label=str(nproc), params={"nproc": nproc}, throughput=throughput,
                         config=RunConfig(batch_size=8, nproc=nproc)) for nproc, throughput in ((1, 100.0), (2, 190.0),
                                                                                               (4, 300.0))]
    scaled = scaling_rows(points)
    assert [row.world_size for row in scaled] == [1, 2, 4]
    assert [row.efficiency_pct for row in scaled] == pytest.approx([100.0, 95.0, 75.0])
    assert [row.per_rank_throughput for row in scaled] == pytest.approx([100.0, 95.0, 75.0])
    assert single_rank(RunConfig(nproc=2, parallel="fsdp", grad_accum=2)) == RunConfig(grad_accum=2)


def test_scale_drops_ddp_settings_at_one_rank_and_keeps_them_at_n():
    base = RunConfig(nproc=4, ddp_bucket_mb=100.0, static_graph=True, batch_size=8)
    one, four = at_rank_counts([base], [1, 4])
    assert one == RunConfig(batch_size=8) and one.validate()
    assert four.nproc == 4 and four.ddp_bucket_mb == 100.0 and four.static_graph


# ---------------------------------------------------------------------------------------------- bad inputs

def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "Traceback" not in err
    return err


def test_nproc_zero_is_refused(capsys):
    assert main(["run", "--nproc", "0", *TINY]) == 2
    assert "--nproc must be a positive integer" in _one_line_error(capsys)


def test_more_ranks_than_visible_gpus_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["run", "--nproc", "2", *TINY[:-2], "--device", "cuda"]) == 2
    assert "--nproc 2 needs 2 GPUs on this node and 1 are visible" in _one_line_error(capsys)


def test_a_rendezvous_port_in_use_is_refused(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["run", "--nproc", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", *TINY,
                     "--out", str(tmp_path / "r")]) == 2
    assert f"port {port} is already in use" in _one_line_error(capsys)


def test_cuda_without_nccl_is_refused(capsys, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(PerflabError, match="needs NCCL"):
        check_launch(RunConfig(nproc=2, device="cuda"))


def _failure(rank_message: str, time_ns: int, perflab_error: bool = False):
    info = {"py_callstack": f"Traceback (most recent call last):\n  ...\n{rank_message}", "timestamp": "1700000000",
            "time_ns": time_ns, "perflab_error": perflab_error}
    return SimpleNamespace(message={"message": rank_message, "extraInfo": info}, pid=4242, exitcode=1,
                           timestamp=1700000000)


def test_the_first_rank_to_fail_is_reported_not_a_peers_follow_on_error():
    # both errors carry the same whole-second timestamp; the nanosecond time decides
    failures = {0: _failure("RuntimeError: Connection closed by peer", 2_000),
                1: _failure("ValueError: planted failure on rank 1", 1_000)}
    error = rank_failure(SimpleNamespace(failures=failures))
    assert error.exit_code == 1 and str(error).startswith("rank 1 (pid 4242) failed")
    assert "planted failure" in str(error) and "Connection closed" not in str(error)
    mistake = rank_failure(SimpleNamespace(failures={0: _failure("PerflabError: --batch is too big", 5, True)}))
    assert mistake.exit_code == 2 and str(mistake) == "rank 0: --batch is too big"


def test_a_rank_the_launcher_stopped_is_not_reported_as_the_failure():
    # torch stamps a signalled rank in whole seconds, earlier than the nanosecond time of the failure that caused it
    stopped = SimpleNamespace(message="Signal 15 (SIGTERM) received by PID 4343", pid=4343, exitcode=-15,
                              timestamp=1)
    failures = {0: _failure("ValueError: planted failure on rank 0", 1_700_000_000_500_000_000), 1: stopped}
    assert "planted failure" in str(rank_failure(SimpleNamespace(failures=failures)))
    crashed = SimpleNamespace(message="Signal 11 (SIGSEGV) received by PID 4343", pid=4343, exitcode=-11,
                              timestamp=1)
    failures = {0: _failure("RuntimeError: Connection closed by peer", 1_700_000_000_500_000_000), 1: crashed}
    assert "SIGSEGV" in str(rank_failure(SimpleNamespace(failures=failures)))


# ---------------------------------------------------------------------------------------------- real ranks

def test_scale_runs_gloo_ranks_gathers_one_result_and_computes_efficiency(tmp_path):
    out = tmp_path / "scale"
    assert main(["scale", "--nproc", "2", *TINY, "--check-quality", "--quality-steps", "3", "--out", str(out)]) == 0
    scale = json.loads((out / "scale.json").read_text())
    by_ranks = {row["params"]["nproc"]: row for row in scale["rows"]}
    assert set(by_ranks) == {1, 2} and by_ranks[1]["efficiency_pct"] == pytest.approx(100.0)
    two = by_ranks[2]
    assert two["efficiency_pct"] == pytest.approx(100 * two["throughput"] / (2 * by_ranks[1]["throughput"]))
    point = next(json.loads((path / "result.json").read_text()) for path in (out / "points").iterdir()
                 if "nproc-2" in path.name)
    assert point["world_size"] == 2 and "data-parallel" in point["levers"]
    dist = point["metrics"]["distributed"]
    assert dist["backend"] == "gloo" and dist["global_batch_size"] == 16
    assert [rank["rank"] for rank in dist["per_rank"]] == [0, 1]
    for rank in dist["per_rank"]:
        assert rank["throughput_samples_per_s"] > 0 and rank["step_ms_mean"] > 0 and rank["memory"]
    assert dist["straggler_spread_pct"] >= 0
    assert all(trial["samples"] == 3 * 16 for trial in point["trials"])
    # the loss trajectory of the two ranks matches one process on the global batch
    assert point["quality"]["verdict"] == "pass" and point["quality"]["world_size"] == 2
    assert point["quality"]["metrics"]["max_loss_rel_delta"] < 1e-5


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue  # the process ended while we looked
    return found


def test_a_rank_that_raises_ends_the_run_with_its_message_once_and_no_orphans(tmp_path, capfd):
    out = tmp_path / "fails"
    began = time.monotonic()
    code = main(["run", "--workload", FAILS_ON_RANK1, "--nproc", "2", "--device", "cpu", "--batch", "4",
                 "--steps", "5", "--warmup", "1", "--trials", "1", "--out", str(out)])
    output = "".join(capfd.readouterr())
    # the failing rank's error is the user's own code: exit 2, its frame shown, once
    assert code == 2, output
    assert output.count("planted failure on rank 1") == 1, output
    assert "rank 1" in output and "ValueError" in output and "fails_on_rank1.py" in output
    assert not out.exists()  # nothing partial is left as a result
    time.sleep(0.5)
    assert _processes_mentioning(str(out)) == [], "rank processes outlived the run"
    assert time.monotonic() - began < 200


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (device kind nvidia-h200-x2)")
def test_two_gpus_profile_measures_exposed_nccl_communication_of_the_planted_case(tmp_path):
    out = tmp_path / "planted"
    assert main(["profile", "--workload", "tests/planted/big_gradients.py:build", "--nproc", "2", "--device", "cuda",
                 "--batch", "8", "--steps", "8", "--warmup", "2", "--trials", "1", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    comm = result["metrics"]["collectives"]
    assert [rank["rank"] for rank in comm["per_rank"]] == [0, 1]
    assert comm["communication_ms_per_step"] > 0 and comm["nccl_kernels_per_step"] >= 1
    assert (out / "trace.rank1.json").is_file()
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    assert diagnosis["bottleneck"] == "collectives"
    assert result["metrics"]["distributed"]["backend"] == "nccl"


def test_a_rank_that_stalls_ends_the_run_after_the_rank_timeout_with_one_line(tmp_path, capfd):
    out = tmp_path / "stalls"
    began = time.monotonic()
    code = main(["run", "--workload", "tests/planted/stalls_on_rank1.py:build", "--nproc", "2", "--device", "cpu",
                 "--batch", "4", "--steps", "5", "--warmup", "1", "--trials", "1", "--rank-timeout", "5",
                 "--out", str(out)])
    output = "".join(capfd.readouterr())
    assert code == 1, output
    assert "(--rank-timeout) for the other ranks" in output and "Traceback" not in output, output
    assert not out.exists()
    time.sleep(0.5)
    assert _processes_mentioning(str(out)) == [], "the stalled rank outlived the run"
    assert time.monotonic() - began < 120


def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    out = tmp_path / "orphans"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "perflab", "run", "--workload",
                                 "tests/planted/stalls_on_rank1.py:build", "--nproc", "2", "--device", "cpu", "--batch",
                                 "4", "--steps", "5", "--warmup", "1", "--trials", "1", "--out", str(out)],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len([pid for pid in _processes_mentioning(str(out)) if pid != launcher.pid]) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
            time.sleep(0.2)
        launcher.kill()  # SIGKILL: torchrun inside it cannot stop the ranks
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _processes_mentioning(str(out)):
            assert time.monotonic() < deadline, "ranks outlived their killed launcher"
            time.sleep(0.2)
    finally:
        launcher.kill()

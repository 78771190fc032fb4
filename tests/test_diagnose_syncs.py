"""Diagnosis of host-device syncs: every source found and attributed, the idle after a sync charged to it, the
DataLoader's own work left to the input pipeline, expected gains, and levers that were tried and lost."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab import RunConfig
from perflab.cli import main
from perflab.diagnose import diagnose, diagnose_path
from perflab.diagnose.sync_sites import DDP_LOGGING, EXPLICIT_SYNC
from perflab.errors import PerflabError
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from perflab.report.diagnosis import diagnosis_markdown
from test_diagnose import FIXTURES, PLANTED, _x, kernel, launch, steps, write_trace

GPU = FIXTURES / "gpu"
CPU = FIXTURES / "cpu"
GPU_SYNC_FIXTURES = {  # recorded on an H100 by benchmarks/diagnose_one.py; the op each one's syncs come from
    "sync__cpu_per_block": "aten::to",
    "sync__nonzero_router": "aten::nonzero",
}
RECORD_HINT = ("GPU fixture not recorded yet: on an H100 run `python -m benchmarks.diagnose_one --out DIR "
               "sync__cpu_per_block sync__nonzero_router` and copy DIR/fixtures/* to tests/fixtures/traces/gpu/")


def finding(diagnosis, cls):
    return next((f for f in diagnosis.findings if f.cls == cls), None)


# --- recorded traces --------------------------------------------------------------------------------------

def test_item_syncs_on_a_recorded_gpu_trace_are_counted_per_step_by_op_and_runtime_call():
    diagnosis, _ = diagnose_path(GPU / "sync__item_after_layer.json.gz")
    syncs = diagnosis.profile.syncs
    assert syncs.per_step == 12
    assert syncs.by_op_per_step == {"aten::item": 12}
    assert syncs.by_call_per_step == {"cudaStreamSynchronize": 12}
    assert syncs.by_phase_per_step == {"forward": 12} and syncs.in_model_per_step == 12


def test_the_harness_synchronize_after_the_profiled_steps_is_not_a_step_sync():
    # every recorded GPU trace ends with the trial's cudaDeviceSynchronize, after the last ProfilerStep
    for trace in GPU.glob("*.json.gz"):
        diagnosis, _ = diagnose_path(trace)
        assert "cudaDeviceSynchronize" not in diagnosis.profile.syncs.by_call_per_step, trace.name


def test_blocking_pageable_input_copies_are_syncs_of_the_h2d_phase_not_a_sync_finding():
    diagnosis, _ = diagnose_path(GPU / "h2d__pageable_inputs.json.gz")
    syncs = diagnosis.profile.syncs
    assert syncs.by_op_per_step == {"aten::to": 2} and syncs.by_phase_per_step == {"h2d": 2}
    assert diagnosis.bottleneck == "host-to-device copies"
    assert finding(diagnosis, "host-device sync") is None


def test_nonzero_per_block_on_a_cpu_trace_is_named_with_its_python_function():
    diagnosis, _ = diagnose_path(CPU / "sync__nonzero_router.json.gz")
    syncs = diagnosis.profile.syncs
    assert diagnosis.bottleneck == "host-device sync"
    assert syncs.by_op_per_step == {"aten::nonzero": 12}
    assert list(syncs.by_python_per_step) == ["nonzero_router.py(18): forward"]
    assert "nonzero_static" in " ".join(diagnosis.advice)


def test_cpu_copies_of_a_cpu_tensor_are_not_syncs_on_a_cpu_trace():
    diagnosis, _ = diagnose_path(CPU / "compute__cpu_sync_per_block.json.gz")
    assert diagnosis.profile.syncs.per_step == 0
    assert finding(diagnosis, "host-device sync") is None


@pytest.mark.parametrize("name", sorted(GPU_SYNC_FIXTURES))
def test_recorded_gpu_sync_workloads_are_named_host_device_sync_without_cuda_graphs(name):
    trace = GPU / f"{name}.json.gz"
    if not trace.exists():
        pytest.skip(RECORD_HINT)
    diagnosis, _ = diagnose_path(trace)
    assert diagnosis.bottleneck == "host-device sync", diagnosis.headline
    assert GPU_SYNC_FIXTURES[name] in diagnosis.profile.syncs.by_op_per_step
    assert diagnosis.profile.syncs.by_python_per_step  # recorded with stacks
    assert all("cuda-graphs" not in f.levers for f in diagnosis.findings)
    idle = diagnosis.profile.gpu.idle_split_pct
    expected = idle["host-device syncs"]
    if "gpu_idle_launching_pct" in diagnosis.evidence:  # the syncs hold the host in lockstep: launch idle too
        expected += idle["launch / framework overhead"]
    assert diagnosis.expected_gain_pct == pytest.approx(expected, abs=0.2)


def test_syncs_that_hold_the_host_in_lockstep_come_before_launch_overhead():
    # nonzero_router on the H100: 12 nonzero per step, little idle right after each, most idle while the host
    # launches the next block's kernels one by one. CUDA graphs and compile cannot capture that step.
    diagnosis, _ = diagnose_path(GPU / "sync__nonzero_router.json.gz")
    assert diagnosis.bottleneck == "host-device sync"
    assert "remove the syncs first" in diagnosis.headline
    launch = finding(diagnosis, "launch / framework overhead")
    assert launch is not None and launch.confidence <= diagnosis.confidence


# --- issue 14: the DataLoader's own host work belongs to the input pipeline ----------------------------------

def test_item_calls_inside_the_dataloader_are_input_pipeline_work_not_step_syncs():
    # `perflab profile --workload augment --batch 4 --steps 6 --warmup 2 --trials 2` on the CPU: per-sample
    # transforms call .item() 16 times per step inside DataLoader.__next__
    diagnosis, _ = diagnose_path(CPU / "input_pipeline__augment_cpu.json.gz")
    syncs = diagnosis.profile.syncs
    assert diagnosis.bottleneck == "input pipeline"
    assert finding(diagnosis, "host-device sync") is None
    assert syncs.per_step == 0 and diagnosis.profile.host.item_calls_per_step == 0
    assert syncs.in_loader_by_op_per_step == {"aten::item": 16}
    assert diagnosis.evidence["loader_host_ops_per_step"] == {"aten::item": 16}


def test_a_gpu_sync_inside_dataloader_next_is_not_charged_to_syncs(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events += [_x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 600),
                   _x("cpu_op", "aten::item", base + 100, 300),
                   _x("cuda_runtime", "cudaStreamSynchronize", base + 110, 280),
                   _x("user_annotation", "forward", base + 600, 400), launch(base + 610, 10 + i),
                   kernel("ampere_sgemm_64x64_nn", base + 620, 370, 10 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    assert diagnosis.profile.syncs.per_step == 0
    assert diagnosis.profile.syncs.in_loader_per_step == 1
    assert diagnosis.profile.gpu.idle_split_pct["host-device syncs"] == 0


# --- synthetic GPU traces shaped like kineto's ---------------------------------------------------------------

def cpu_copy_per_block(tmp_path: Path, blocks: int = 5, sync_name: str = "cudaStreamSynchronize") -> Path:
    """A step of blocks whose GPU work (23 µs) is shorter than the host's (100 µs): the GPU is already idle
    when each `.cpu()` starts, as in the workload that was misdiagnosed as launch overhead."""
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events.append(_x("user_annotation", "forward", base, 1000))
        for block in range(blocks):
            t, corr = base + block * 200, 1000 * i + 10 * block
            events += [_x("cpu_op", "aten::linear", t, 30), launch(t + 20, corr),
                       kernel("ampere_sgemm_64x64_nn", t + 25, 20, corr),
                       _x("cpu_op", "aten::mean", t + 30, 15), launch(t + 38, corr + 1),
                       kernel("reduce_kernel", t + 45, 3, corr + 1),
                       _x("cpu_op", "aten::to", t + 50, 45), _x("cpu_op", "aten::_to_copy", t + 52, 42),
                       _x("cpu_op", "aten::copy_", t + 55, 38),
                       _x("cuda_runtime", "cudaMemcpyAsync", t + 58, 10, correlation=corr + 2),
                       _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 66, 2, tid=7, bytes=4,
                          correlation=corr + 2),
                       _x("cuda_runtime", sync_name, t + 69, 20)]
    return write_trace(tmp_path / "t.json", events)


def test_idle_after_a_cpu_copy_is_charged_to_the_sync_even_when_the_gpu_idled_before_it(tmp_path):
    diagnosis = diagnose(cpu_copy_per_block(tmp_path))
    idle = diagnosis.profile.gpu.idle_split_pct
    syncs = diagnosis.profile.syncs
    assert diagnosis.bottleneck == "host-device sync", diagnosis.headline
    assert syncs.by_op_per_step == {"aten::to": 5}  # one .cpu() is one sync, named after its outermost op
    assert syncs.by_call_per_step == {"cudaMemcpyAsync (D2H pageable)": 5, "cudaStreamSynchronize": 5}
    assert idle["host-device syncs"] > idle["launch / framework overhead"]
    assert ".cpu()" in diagnosis.advice[0]


def test_the_cpu_copy_case_was_launch_overhead_before_idle_was_charged_from_the_sync_op(tmp_path):
    # Charged from the sync call alone (the old split), the GPU idle before cudaStreamSynchronize went to
    # launching; from the start of the op that synced, it goes to the sync.
    diagnosis = diagnose(cpu_copy_per_block(tmp_path))
    idle = diagnosis.profile.gpu.idle_split_pct
    assert idle["host-device syncs"] > 80 and idle["launch / framework overhead"] < 5
    assert all("cuda-graphs" not in f.levers for f in diagnosis.findings)


def test_event_synchronize_is_a_sync_source(tmp_path):
    diagnosis = diagnose(cpu_copy_per_block(tmp_path, sync_name="cudaEventSynchronize"))
    assert diagnosis.profile.syncs.by_call_per_step["cudaEventSynchronize"] == 5


def test_nonzero_router_syncs_are_named_after_nonzero(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events.append(_x("user_annotation", "forward", base, 1000))
        for block in range(4):
            t, corr = base + block * 250, 1000 * i + 10 * block
            events += [_x("cpu_op", "aten::linear", t, 30), launch(t + 20, corr),
                       kernel("ampere_sgemm_64x64_nn", t + 25, 40, corr),
                       _x("cpu_op", "aten::nonzero", t + 40, 60), launch(t + 45, corr + 1),
                       kernel("cub::DeviceSelectSweepKernel", t + 66, 4, corr + 1),
                       _x("cuda_runtime", "cudaMemcpyAsync", t + 52, 6, correlation=corr + 2),
                       _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", t + 71, 1, tid=7, bytes=8,
                          correlation=corr + 2),
                       _x("cuda_runtime", "cudaStreamSynchronize", t + 60, 14)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    syncs = diagnosis.profile.syncs
    assert diagnosis.bottleneck == "host-device sync"
    assert syncs.by_op_per_step == {"aten::nonzero": 4}
    assert syncs.by_call_per_step == {"cudaStreamSynchronize": 4}  # a copy into pinned memory does not block


def test_an_explicit_synchronize_in_the_step_is_a_sync_without_an_op(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events += [_x("user_annotation", "forward", base, 1000), launch(base + 5, 10 + i),
                   kernel("ampere_sgemm_64x64_nn", base + 10, 300, 10 + i),
                   _x("cuda_runtime", "cudaDeviceSynchronize", base + 20, 292),
                   launch(base + 700, 20 + i), kernel("ampere_sgemm_64x64_nn", base + 705, 290, 20 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    syncs = diagnosis.profile.syncs
    assert syncs.by_op_per_step == {EXPLICIT_SYNC: 1}
    assert diagnosis.bottleneck == "host-device sync"
    assert "torch.cuda.synchronize()" in diagnosis.advice[0]


def _ddp_step(base, corr, user_sync=False):
    """One step under DDP: its forward range, DDP's logging syncs before the first op (as recorded on 2 H200s: 8
    cudaEventSynchronize per iteration in its first 10), then the model's ops; `user_sync`: one more inside them."""
    events = [_x("user_annotation", "forward", base, 1000), _x("user_annotation", "DistributedDataParallel.forward",
                                                                base + 1, 990)]
    events += [_x("cuda_runtime", "cudaEventSynchronize", base + 5 + 10 * n, 5) for n in range(8)]
    events += [_x("cpu_op", "aten::mm", base + 100, 40), launch(base + 110, corr),
               kernel("ampere_sgemm_64x64_nn", base + 120, 300, corr)]
    if user_sync:
        events.append(_x("cuda_runtime", "cudaEventSynchronize", base + 150, 270))
    return events + [_x("cpu_op", "aten::mm", base + 600, 40), launch(base + 610, corr + 100),
                     kernel("ampere_sgemm_64x64_nn", base + 620, 300, corr + 100)]


def test_ddps_runtime_logging_syncs_are_counted_apart_and_a_users_sync_in_its_forward_is_not(tmp_path):
    events = steps(2, 1000) + _ddp_step(0, 10) + _ddp_step(1000, 11)
    diagnosis = diagnose(write_trace(tmp_path / "ddp.json", events))
    syncs = diagnosis.profile.syncs
    assert syncs.per_step == 0 and syncs.framework_per_step == {DDP_LOGGING: 8}
    assert finding(diagnosis, "host-device sync") is None
    assert any("DDP's runtime-stats logging" in note for note in diagnosis.profile.notes)
    events = steps(2, 1000) + _ddp_step(0, 10, user_sync=True) + _ddp_step(1000, 11, user_sync=True)
    syncs = diagnose(write_trace(tmp_path / "user.json", events)).profile.syncs
    assert syncs.per_step == 1 and syncs.by_op_per_step == {EXPLICIT_SYNC: 1}  # after the first op: the model's


def test_a_sync_that_does_not_lead_is_a_secondary_finding_in_forward(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events.append(_x("user_annotation", "forward", base, 1000))
        for op in range(40):  # launch bound: 25 µs of host time per 3 µs kernel
            t, corr = base + op * 25, 1000 * i + op
            events += [_x("cpu_op", "aten::add", t, 22), launch(t + 10, corr, dur=6),
                       kernel("vectorized_elementwise_kernel", t + 18, 3, corr)]
        events += [_x("cpu_op", "aten::item", base + 1001 - 2, 1),  # one .item() at the very end of forward
                   _x("cuda_runtime", "cudaStreamSynchronize", base + 999.2, 0.5)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    sync = finding(diagnosis, "host-device sync")
    assert diagnosis.bottleneck == "launch / framework overhead"
    assert sync is not None and sync.confidence < 0.5
    assert "cuda-graphs" not in diagnosis.levers  # a CUDA graph cannot capture a step that syncs
    assert any("cannot capture" in advice for advice in diagnosis.advice)


# --- expected gain -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("trace", sorted(FIXTURES.glob("*/*.json.gz")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_finding_carries_an_expected_gain_between_0_and_100(trace):
    diagnosis, _ = diagnose_path(trace)
    for f in diagnosis.findings:
        assert 0.0 <= f.expected_gain_pct <= 100.0 and f.gain_basis, f
    assert diagnosis.expected_gain_pct == diagnosis.findings[0].expected_gain_pct


@pytest.mark.parametrize("name, cause", [
    ("sync__item_after_layer", "host-device syncs"), ("input_pipeline__cpu_loader", "waiting for data"),
    ("launch__tiny_ops", "launch / framework overhead")])
def test_the_top_findings_gain_is_the_gpu_idle_it_explains(name, cause):
    diagnosis, _ = diagnose_path(GPU / f"{name}.json.gz")
    assert diagnosis.expected_gain_pct == pytest.approx(diagnosis.profile.gpu.idle_split_pct[cause], abs=0.1)
    assert diagnosis.expected_gain_pct > 30


def test_expected_gain_is_saved_in_diagnosis_json_and_printed(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trace.json.gz").write_bytes((GPU / "sync__item_after_layer.json.gz").read_bytes())
    assert main(["diagnose", str(run)]) == 0
    saved = json.loads((run / "diagnosis.json").read_text())
    assert saved["expected_gain_pct"] == pytest.approx(39.8, abs=0.5)
    assert all("expected_gain_pct" in f for f in saved["findings"])
    assert "explains 40% of the step" in capsys.readouterr().out
    assert "explains 40% of the step" in diagnosis_markdown(saved)


# --- levers tried and lost ---------------------------------------------------------------------------------

def test_a_lever_that_lost_is_not_proposed_again_and_the_finding_says_what_is_left():
    trace = GPU / "h2d__pageable_inputs.json.gz"
    before, _ = diagnose_path(trace)
    after = diagnose(trace, tried_and_lost={"pin-memory"})
    assert "pin-memory" in before.levers
    assert "pin-memory" not in after.levers and after.levers[0] == "prefetcher-stream"
    assert after.advice[0].startswith("pinning lost") and "copy uint8" in after.advice[0]
    assert after.evidence["tried_and_lost"] == ["pin-memory"] and after.tried_and_lost == ["pin-memory"]
    assert "Tried on this run and lost" in diagnosis_markdown(after)


def test_input_pipeline_after_workers_lost_advises_caching_or_gpu_augmentation():
    diagnosis = diagnose(GPU / "input_pipeline__cpu_loader.json.gz",
                         tried_and_lost={"workers", "persistent-workers"})
    assert diagnosis.bottleneck == "input pipeline"
    assert diagnosis.levers == ["prefetch-factor", "prefetcher-stream"]
    assert "cache decoded" in diagnosis.advice[0]


def test_tried_and_lost_refuses_an_unknown_lever_name():
    with pytest.raises(PerflabError, match="unknown lever.*pinned-memory"):
        diagnose(GPU / "h2d__pageable_inputs.json.gz", tried_and_lost={"pinned-memory"})


def test_diagnose_command_takes_the_levers_tried_and_lost(capsys):
    trace = GPU / "input_pipeline__cpu_loader.json.gz"
    assert main(["diagnose", str(trace), "--tried-and-lost", "workers,persistent-workers"]) == 0
    out = capsys.readouterr().out
    assert "tried and lost" in out and "cache decoded" in out
    assert main(["diagnose", str(trace), "--tried-and-lost", "wrokers"]) == 2
    assert "unknown lever(s) in tried_and_lost: wrokers" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.parametrize("workload, op", [("cpu_sync_per_block.py", "aten::to"), ("nonzero_router.py", "aten::nonzero")])
def test_live_gpu_runs_of_the_planted_sync_workloads_are_host_device_sync(tmp_path, workload, op):
    cfg = resolve_config(RunConfig(workload=str(PLANTED / workload), device="cuda", mode="infer", batch_size=512,
                                   steps=4, trials=1, warmup=3), None)
    _, diagnosis, _ = profile_run(cfg.workload, cfg, tmp_path, CaptureOptions(wait=1, warmup=1, active=2,
                                                                               with_stack=True))
    assert diagnosis.bottleneck == "host-device sync", diagnosis.headline
    assert op in diagnosis.profile.syncs.by_op_per_step
    assert all("cuda-graphs" not in f.levers for f in diagnosis.findings)


def test_pageable_copies_longer_than_the_data_wait_rank_ahead_of_the_input_pipeline(tmp_path):
    events = steps(2, 1000)  # 40% waiting for data, 45% waiting on a pageable copy: both saturate confidence
    for i in range(2):
        base = i * 1000
        events += [_x("user_annotation", "data", base, 400), _x("user_annotation", "h2d", base + 400, 450),
                   _x("cuda_runtime", "cudaMemcpyAsync", base + 405, 440, correlation=50 + i),
                   _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", base + 410, 435, tid=7, bytes=2**26,
                      correlation=50 + i),
                   _x("user_annotation", "forward", base + 850, 150), launch(base + 852, 60 + i),
                   kernel("ampere_sgemm_64x64_nn", base + 858, 140, 60 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    confidences = {f.cls: f.confidence for f in diagnosis.findings}
    # the copies take longer than the data wait (435 vs 400 µs): copies vs input puts the copies ahead
    assert confidences["host-to-device copies"] == 0.95 and confidences["input pipeline"] < 0.95
    assert diagnosis.bottleneck == "host-to-device copies"
    assert [f.cls for f in diagnosis.findings][:2] == ["host-to-device copies", "input pipeline"]

"""perflab diagnose: the planted bottlenecks are named, from recorded fixtures, synthetic GPU traces and live CPU runs."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from perflab import RunConfig
from perflab.cli import main
from perflab.diagnose import CLASS_SLUGS, Diagnosis, Finding, diagnose, diagnose_path, find_trace
from perflab.diagnose.intervals import Intervals
from perflab.diagnose.summary import kernel_kind, memcpy_kind
from perflab.diagnose.trace import load_trace
from perflab.errors import PerflabError
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from perflab.report.diagnosis import diagnosis_markdown

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "traces"
PLANTED = HERE / "planted"
FIXTURE_FILES = sorted(FIXTURES.glob("cpu/*.json.gz")) + sorted(FIXTURES.glob("gpu/*.json.gz"))  # patterns/: test_hotspots


def expected_class(path: Path) -> str:
    return CLASS_SLUGS[path.name.split("__")[0]]


@pytest.mark.parametrize("trace", FIXTURE_FILES, ids=[f"{p.parent.name}/{p.name}" for p in FIXTURE_FILES])
def test_diagnose_names_the_planted_class_of_each_recorded_trace(trace):
    diagnosis, _ = diagnose_path(trace)
    assert diagnosis.bottleneck == expected_class(trace), diagnosis.headline
    assert diagnosis.confidence >= 0.5
    assert diagnosis.evidence


def test_fixture_set_covers_the_cpu_detectable_classes():
    classes = {expected_class(p) for p in FIXTURES.glob("cpu/*.json.gz")}
    assert {"input pipeline", "launch / framework overhead", "host-device sync", "memory bandwidth",
            "compute bound"} <= classes


def test_fixture_result_sits_next_to_its_trace():
    trace = FIXTURES / "cpu" / "sync__item_after_layer.json.gz"
    assert find_trace(trace)[1] == FIXTURES / "cpu" / "sync__item_after_layer.result.json"


# --- synthetic GPU traces (kineto's Chrome format), so the GPU paths run in CPU-only CI ---------------------

def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_trace(path: Path, events: list[dict], gpu_name: str = "NVIDIA H100 80GB HBM3") -> Path:
    data = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": gpu_name, "totalGlobalMem": 80 * 2**30}],
            "traceEvents": events}
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as stream:
        json.dump(data, stream)
    return path


def kernel(name, ts, dur, corr, ext=-1):
    return _x("kernel", name, ts, dur, tid=7, stream=7, correlation=corr, **{"External id": ext})


def launch(ts, corr, dur=5):
    return _x("cuda_runtime", "cudaLaunchKernel", ts, dur, correlation=corr)


def steps(count, length):
    return [_x("user_annotation", f"ProfilerStep#{i}", i * length, length) for i in range(count)]


def test_gpu_idle_while_the_loader_works_is_an_input_pipeline_bottleneck(tmp_path):
    events = steps(3, 1000)
    for i in range(3):
        base = i * 1000
        events += [_x("user_annotation", "data", base, 700), _x("user_annotation", "forward", base + 700, 300),
                   launch(base + 710, 10 + i), kernel("volta_sgemm_128x64_nn", base + 720, 270, 10 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    idle = diagnosis.profile.gpu.idle_split_pct
    assert diagnosis.bottleneck == "input pipeline"
    assert idle["waiting for data"] == pytest.approx(70.0, abs=1.0)
    assert diagnosis.profile.gpu.busy_pct == pytest.approx(27.0, abs=1.0)
    assert diagnosis.levers[0] == "workers"


def test_gaps_that_begin_inside_a_sync_call_are_blamed_on_the_sync(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events.append(_x("user_annotation", "forward", base, 1000))
        for layer in range(5):  # kernel 100 µs, then .item(): copy back, wait, 100 µs of host work to relaunch
            t = base + layer * 200
            corr = 100 * i + layer
            events += [launch(t, corr), kernel("ampere_sgemm_64x64_nn", t + 6, 100, corr),
                       _x("cpu_op", "aten::item", t + 7, 101),
                       _x("cuda_runtime", "cudaStreamSynchronize", t + 8, 99),
                       _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 106, 1, tid=7, bytes=4)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    gpu = diagnosis.profile.gpu
    assert diagnosis.bottleneck == "host-device sync"
    assert gpu.sync_calls_per_step["cudaStreamSynchronize"] == 5
    assert gpu.idle_split_pct["host-device syncs"] > gpu.idle_split_pct["launch / framework overhead"]


def test_many_short_kernels_with_the_host_launching_are_launch_overhead(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events.append(_x("user_annotation", "forward", base, 1000))
        for op in range(50):  # 20 µs of host time per op, 3 µs kernels
            t = base + op * 20
            corr = 1000 * i + op
            events += [_x("cpu_op", "aten::add", t, 18), launch(t + 10, corr, dur=6),
                       kernel("void at::native::vectorized_elementwise_kernel<4>", t + 17, 3, corr)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    assert diagnosis.bottleneck == "launch / framework overhead"
    assert diagnosis.profile.gpu.short_kernel_count_pct == 100.0
    assert diagnosis.levers[:2] == ["cuda-graphs", "compile"]


def test_pageable_copies_without_overlap_are_a_host_to_device_bottleneck(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events += [_x("user_annotation", "h2d", base, 800),
                   _x("cuda_runtime", "cudaMemcpyAsync", base + 5, 790, correlation=50 + i),
                   _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", base + 10, 780, tid=7, bytes=64 * 2**20,
                      correlation=50 + i),
                   _x("user_annotation", "forward", base + 800, 200), launch(base + 805, 60 + i),
                   kernel("reduce_kernel", base + 812, 150, 60 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json.gz", events))
    copies = diagnosis.profile.gpu.memcpy_table
    assert diagnosis.bottleneck == "host-to-device copies"
    assert copies[0].kind == "H2D pageable" and copies[0].overlap_with_compute_pct == 0.0
    assert "pin-memory" in diagnosis.levers and "uint8" in diagnosis.advice[0]


def test_busy_gpu_in_matmul_kernels_is_compute_bound_with_a_roofline_placement(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        ext = 500 + i
        events += [_x("user_annotation", "forward", base, 100), launch(base + 2, 70 + i),
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": base + 1, "dur": 5,
                    "args": {"External id": ext, "Input Dims": [[4096, 4096], [4096, 4096]],
                             "Input type": ["float", "float"]}},
                   kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", base + 5, 990, 70 + i, ext=ext)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    row = diagnosis.profile.roofline[0]
    assert diagnosis.bottleneck == "compute bound"
    assert row.flops == pytest.approx(2 * 2 * 4096**3)
    assert row.bound == "compute" and row.ceiling_source.startswith("datasheet (H100)")


def test_a_busy_gpu_with_mixed_kernels_has_no_clear_bottleneck(tmp_path):
    events = steps(2, 1000)
    for i in range(2):
        base = i * 1000
        events += [kernel("sm90_xmma_gemm", base, 480, 80 + i), kernel("vectorized_elementwise_kernel", base + 480,
                                                                        500, 90 + i)]
    diagnosis = diagnose(write_trace(tmp_path / "t.json", events))
    assert diagnosis.bottleneck == "no clear bottleneck"
    assert "≥ 95%" in diagnosis.headline


def test_kernels_and_copies_are_classified_by_name():
    assert kernel_kind("ampere_bf16_s16816gemm_bf16_128x128") == "matmul/conv"
    assert kernel_kind("triton_poi_fused_add_mul_0") == "elementwise/reduction"
    assert kernel_kind("cudnn::bn_fw_tr_1C11_kernel_NCHW") == "elementwise/reduction"
    assert kernel_kind("ncclDevKernel_AllReduce_Sum_f32") == "communication"
    assert memcpy_kind("Memcpy HtoD (Pinned -> Device)") == "H2D pinned"
    assert memcpy_kind("Memcpy DtoH (Device -> Pageable)") == "D2H pageable"


def test_interval_union_complement_and_overlap():
    busy = Intervals.union(np.array([0.0, 5.0, 2.0]), np.array([3.0, 6.0, 4.0]))
    assert busy.start.tolist() == [0.0, 5.0] and busy.end.tolist() == [4.0, 6.0]
    gaps = busy.complement(0.0, 10.0)
    assert gaps.start.tolist() == [4.0, 6.0] and gaps.end.tolist() == [5.0, 10.0]
    assert busy.overlap_each(Intervals(np.array([3.0]), np.array([5.5]))).tolist() == [1.5]
    assert busy.contains(np.array([3.9, 4.5])).tolist() == [True, False]


# --- errors ------------------------------------------------------------------------------------------------

def test_diagnose_explains_a_missing_trace(tmp_path, capsys):
    (tmp_path / "result.json").write_text("{}")
    assert main(["diagnose", str(tmp_path)]) == 2
    assert "no trace.json" in capsys.readouterr().err


def test_diagnose_explains_a_truncated_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1')
    with pytest.raises(PerflabError, match="corrupt or was cut short"):
        load_trace(path)


def test_diagnose_explains_a_corrupt_gzip_trace(tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(PerflabError, match="corrupt"):
        load_trace(path)


def test_diagnose_rejects_json_that_is_not_a_chrome_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(PerflabError, match="not a Chrome trace"):
        load_trace(path)


# --- live CPU runs ----------------------------------------------------------------------------------------

def profiled(tmp_path, workload_file: str, **changes):
    cfg = resolve_config(RunConfig(workload=str(PLANTED / workload_file), steps=4, trials=1, warmup=1,
                                   device="cpu", **changes), None)
    return profile_run(cfg.workload, cfg, tmp_path, CaptureOptions(wait=1, warmup=1, active=2))


def test_live_cpu_run_with_a_sleeping_loader_is_an_input_pipeline_bottleneck(tmp_path):
    result, diagnosis, _ = profiled(tmp_path, "slow_loader.py", batch_size=16, workload_options={"item_ms": "2"})
    assert diagnosis.bottleneck == "input pipeline"
    assert result.diagnosis["bottleneck"] == "input pipeline"
    assert json.loads((tmp_path / "diagnosis.json").read_text())["bottleneck"] == "input pipeline"


def test_live_cpu_run_with_item_after_every_layer_is_a_sync_bottleneck(tmp_path):
    _, diagnosis, _ = profiled(tmp_path, "item_sync.py", batch_size=32)
    assert diagnosis.bottleneck == "host-device sync"
    assert diagnosis.evidence["item_calls_per_step"] == 12


def test_live_cpu_run_with_hundreds_of_tiny_ops_is_launch_overhead(tmp_path):
    _, diagnosis, _ = profiled(tmp_path, "tiny_ops.py", batch_size=1)
    assert diagnosis.bottleneck == "launch / framework overhead"


def test_markdown_section_names_the_verdict_evidence_and_levers(tmp_path):
    diagnosis, _ = diagnose_path(FIXTURES / "cpu" / "input_pipeline__sleep_loader.json.gz")
    text = diagnosis_markdown(diagnosis)
    assert text.startswith("## Diagnosis")
    assert "**input pipeline**" in text and "`workers`" in text and "data_wait_share_pct" in text


def test_gpu_split_starts_at_the_first_kernel_when_the_gpu_was_still_running_work_launched_before_the_capture():
    # compute__big_matmul: the host's two steps take 1 ms, the GPU's queue is 83 ms long; the first recorded kernels
    # were launched before the capture (no launch call in the trace), so the first kernel's own wait is unknown and
    # the first kernel launched inside the capture (83 ms in the queue) is the one that tells
    diagnosis, _ = diagnose_path(FIXTURES / "gpu" / "compute__big_matmul.json.gz")
    profile = diagnosis.profile
    assert profile.gpu.busy_pct == pytest.approx(100, abs=0.5)  # 76% before: 40 ms of pre-capture kernel as idle
    assert profile.gpu_start_us > profile.start_us + 40_000
    assert any("launched before the capture" in note for note in profile.notes)
    assert diagnosis.operators.ops[0].op == "aten::linear"  # the host's steps, before gpu_start_us, still count


def _saved_keys_kept(old, new) -> bool:
    """Every key of an old saved dict (nested too) is in the new one, with the same value where it had one."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(key in new and _saved_keys_kept(value, new[key])
                                             for key, value in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(old) == len(new) and all(map(_saved_keys_kept, old, new))
    return old is None or old == new


def test_an_old_diagnosis_loads_as_records_and_saves_every_key_it_had():
    # recorded before syncs, the operator view and expected gains were saved
    saved = json.loads((FIXTURES / "gpu" / "h2d__pageable_inputs.result.json").read_text())["diagnosis"]
    diagnosis = Diagnosis.from_dict(saved)
    assert isinstance(diagnosis.findings[0], Finding) and diagnosis.findings[0].expected_gain_pct is None
    assert diagnosis.profile.gpu.memcpy_table[0].kind.startswith("H2D")
    assert diagnosis.profile.syncs.per_step == 0 and diagnosis.operators is None
    assert _saved_keys_kept(saved, diagnosis.to_dict())
    assert "## Diagnosis" in diagnosis_markdown(saved)


def test_a_fresh_diagnosis_saves_as_plain_json_and_loads_back_equal(tmp_path):
    diagnosis, _ = diagnose_path(FIXTURES / "gpu" / "sync__nonzero_router.json.gz")
    saved = json.loads(json.dumps(diagnosis.to_dict()))
    assert Diagnosis.from_dict(saved) == diagnosis
    assert Diagnosis.from_dict(saved).operators.ops[0].op == diagnosis.operators.ops[0].op

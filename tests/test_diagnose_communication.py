"""Exposed communication named as such on synthetic 2-rank traces: overlap per rank, collective kinds and sizes, bus
bandwidth against the measured peak, the lever that hides it; a GPU idle while the host waits in an FSDP hook is
communication, not launch / framework overhead."""
import json
from pathlib import Path

import pytest

from perflab.diagnose import diagnose
from perflab.diagnose.communication import GatheredCommunication, collective_kind, communication_profile
from perflab.diagnose.summary import summarize
from perflab.diagnose.trace import load_trace
from perflab.distributed.gather import RankReport, collectives_record
from perflab.results import Result
from perflab.results.metrics import Metrics, RankFigures

GPU = "NVIDIA H100 80GB HBM3"
STEP_US = 10_000.0


def _kernel(name, start, end, stream, correlation, args=None):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": end - start, "pid": 0, "tid": stream,
            "args": {"stream": stream, "correlation": correlation, **(args or {})}}


def _trace(path: Path, compute: list, nccl: list, host_ranges: list = (), steps: int = 3) -> Path:
    """`steps` steps of STEP_US: compute kernels and NCCL kernels (name, start, end, args) at offsets in each step,
    host ranges (name, start, end) with CPU ops under them launching nothing."""
    events, correlation = [], 0
    for step in range(steps):
        t0 = step * STEP_US
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t0, "dur": STEP_US,
                       "pid": 1, "tid": 1})
        for start, end in compute:
            correlation += 1
            events.append(_kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t0 + start, t0 + end, 7, correlation))
        for name, start, end, args in nccl:
            correlation += 1
            events.append(_kernel(name, t0 + start, t0 + end, 20, correlation, args))
        for name, start, end in host_ranges:
            events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": t0 + start, "dur": end - start,
                           "pid": 1, "tid": 1})
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": t0 + start + 1,
                           "dur": end - start - 2, "pid": 1, "tid": 1, "args": {"External id": 10_000 + step}})
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": GPU}],
                                "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}}))
    return path


def _sizes(collective, nelems_in, nelems_out):
    return {"Collective name": collective, "In msg nelems": nelems_in, "Out msg nelems": nelems_out,
            "dtype": "Float", "Group size": 2}


# DDP: compute 0-4 ms; a 25M-float (100 MB) all-reduce 3-7 ms -> 1 ms overlapped, 3 ms exposed (30% of the step);
# bus bandwidth 1e8 B / 4 ms x 2(2-1)/2 = 25 GB/s
ALL_REDUCE = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 3_000, 7_000,
              _sizes("allreduce", 25_000_000, 25_000_000))


def test_collective_kinds_come_from_kernel_or_c10d_names():
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert collective_kind("_allgather_base") == "all_gather" and collective_kind("allreduce") == "all_reduce"
    assert collective_kind("ncclKernel_Broadcast_RING_LL_Sum_int8_t") == "broadcast"


def test_kinds_sizes_and_bus_bandwidth_of_the_collectives_of_a_step(tmp_path):
    profile = communication_profile(load_trace(_trace(tmp_path / "ddp.json", [(0, 4_000)], [ALL_REDUCE])))
    assert profile.exposed_share_pct == pytest.approx(30.0) and profile.group_size == 2
    all_reduce = profile.by_kind["all_reduce"]
    assert all_reduce.calls_per_step == 1 and all_reduce.ms_per_step == pytest.approx(4.0)
    assert all_reduce.mean_message_mb == pytest.approx(1e8 / 2**20)
    assert all_reduce.busbw_gbps == pytest.approx(25.0)


def _gathered(tmp_path, rank_traces) -> dict:
    """metrics.collectives of a gathered result, as result.json holds it."""
    reports = []
    for rank, trace in enumerate(rank_traces):
        figures = RankFigures(rank=rank, local_rank=rank, host="node", throughput_samples_per_s=1.0, step_ms_mean=10.0,
                              step_ms_p50=10.0, phases_ms={}, memory=None, gpu=None,
                              collectives=communication_profile(load_trace(trace)).to_dict())
        reports.append(RankReport(figures=figures, trials=[], notes=[]))
    return collectives_record(reports)


def _result(parallel: str, collectives: dict) -> Result:
    return Result(config={"mode": "train", "parallel": parallel, "nproc": 2, "precision": "bf16", "device": "cuda"},
                  environment={}, workload={}, trials=[], metrics=Metrics(collectives=collectives), world_size=2)


def _peak_cache(tmp_path, monkeypatch, busbw_gbps):
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    key = f"{GPU} | torch 2.11.0 | collectives over 2 ranks on one node"
    (tmp_path / "cache" / "calibration.json").write_text(json.dumps({key: {
        "ranks": 2, "peak_busbw_gbps": {"all_reduce": busbw_gbps}, "latency_us": {"all_reduce": 20.0}}}))


def test_ddp_exposed_all_reduce_names_overlap_per_rank_and_bus_bandwidth_against_the_peak(tmp_path, monkeypatch):
    _peak_cache(tmp_path, monkeypatch, busbw_gbps=100.0)
    rank0 = _trace(tmp_path / "r0.json", [(0, 4_000)], [ALL_REDUCE])
    rank1 = _trace(tmp_path / "r1.json", [(0, 6_000)], [ALL_REDUCE])  # rank 1 hides more of it: 3 ms of 4
    diagnosis = diagnose(rank0, _result("ddp", _gathered(tmp_path, [rank0, rank1])))
    assert diagnosis.bottleneck == "collectives"
    evidence = diagnosis.evidence
    assert evidence["worst_rank"] == 0 and evidence["overlap_pct_per_rank"] == {"0": 25.0, "1": 75.0}
    assert evidence["collectives"]["all_reduce"]["busbw_gbps"] == pytest.approx(25.0)
    assert evidence["peak_busbw_gbps"] == 100.0
    assert "25 GB/s bus (25% of the measured peak)" in diagnosis.headline
    assert diagnosis.levers[0] == "ddp-bucket-size"  # far below the peak: the all-reduce starts too late


def test_an_all_reduce_near_the_links_peak_is_hidden_by_sending_fewer_bytes(tmp_path, monkeypatch):
    _peak_cache(tmp_path, monkeypatch, busbw_gbps=30.0)  # 25 of 30 GB/s: 83%
    trace = _trace(tmp_path / "r0.json", [(0, 4_000)], [ALL_REDUCE])
    diagnosis = diagnose(trace, _result("ddp", _gathered(tmp_path, [trace, trace])))
    assert diagnosis.levers[0] == "bf16-comm-hook" and "its bytes are the limit" in diagnosis.headline


def test_gpu_idle_while_the_host_waits_in_an_fsdp_hook_is_communication_not_launch_overhead(tmp_path):
    # per 10 ms step: compute 0-2 ms; the host sits in FSDP::pre_forward 2-7 ms with nothing on the GPU (the
    # all-gather it waits for is issued late); all-gather 7-8.5 ms; compute 8.5-10 ms
    gather = ("ncclDevKernel_AllGather_RING_LL", 7_000, 8_500, _sizes("_allgather_base", 5_000_000, 10_000_000))
    trace = _trace(tmp_path / "fsdp.json", [(0, 2_000), (8_500, 10_000)], [gather],
                   host_ranges=[("FSDP::pre_forward", 2_000, 7_000)])
    idle = summarize(load_trace(trace)).gpu.idle_split_pct
    assert idle["waiting on communication"] == pytest.approx(50.0)
    assert idle["launch / framework overhead"] == pytest.approx(0.0)
    diagnosis = diagnose(trace, _result("fsdp", _gathered(tmp_path, [trace, trace])))
    assert diagnosis.bottleneck == "collectives"
    assert "launch / framework overhead" not in {finding.cls for finding in diagnosis.findings}
    # 1.5 ms of exposed NCCL + 5 ms of the host waiting in the hook = 65% of the step
    assert diagnosis.evidence["exposed_communication_pct_of_step"] == pytest.approx(65.0)
    assert diagnosis.evidence["collectives"]["all_gather"]["mean_message_mb"] == pytest.approx(4e7 / 2**20, rel=1e-2)
    assert diagnosis.levers[:2] == ["fsdp-prefetch", "fsdp-no-reshard-last"]


RANKS = Path(__file__).parent / "fixtures" / "traces" / "ranks"  # 2-rank profiles recorded on 2 H200s


@pytest.mark.parametrize("case, kinds, first_levers", [
    ("ddp__big_gradients", {"all_reduce"}, {"ddp-bucket-size", "bf16-comm-hook", "grad-accum"}),
    ("fsdp__transformer_125m", {"all_gather", "reduce_scatter"}, {"fsdp-prefetch", "fsdp-no-reshard-last"}),
])
def test_recorded_two_gpu_traces_are_diagnosed_as_exposed_communication(case, kinds, first_levers, tmp_path,
                                                                         monkeypatch):
    # `BENCH_DISTRIBUTED_PART=fixtures python -m benchmarks.bench_distributed` on nvidia-h100-x2 (came as 2x H200)
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path))  # no calibrated peak here: the bus bandwidth stands alone
    folder = RANKS / case
    result = Result.load(folder)
    per_rank = [communication_profile(load_trace(folder / name)) for name in ("trace.json.gz", "trace.rank1.json.gz")]
    recorded = {row["rank"]: row for row in result.metrics.collectives["per_rank"]}
    for rank, profile in enumerate(per_rank):  # each rank's figures, read again from its own trace
        assert profile.group_size == 2 and set(profile.by_kind) == kinds
        assert profile.exposed_share_pct == pytest.approx(recorded[rank]["exposed_share_pct"], abs=0.1)
    diagnosis = diagnose(folder / "trace.json.gz", result)
    assert diagnosis.bottleneck == "collectives"
    evidence = diagnosis.evidence
    assert set(evidence["overlap_pct_per_rank"]) == {"0", "1"}
    assert set(evidence["collectives"]) == kinds and all(kind in diagnosis.headline for kind in kinds)
    assert all(evidence["collectives"][kind]["busbw_gbps"] > 0 for kind in kinds)
    assert first_levers <= set(diagnosis.levers[:len(first_levers) + 2])
    assert "launch" not in diagnosis.headline  # the FSDP step waiting in collectives is not framework overhead


def test_the_transfer_is_told_from_waiting_for_the_other_rank_on_recorded_traces(tmp_path, monkeypatch):
    # FSDP2's all-gathers on rank 0 of 2 H200s ran 1.5-3 ms each, rank 1's ~74 us: rank 0's kernels held the
    # time rank 1 took to arrive, so their bus bandwidth over the kernels' time (4 GB/s) was not the link's
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path))
    folder = RANKS / "fsdp__transformer_125m"
    traces = [folder / "trace.json.gz", folder / "trace.rank1.json.gz"]
    summary = GatheredCommunication.from_dict(_gathered(tmp_path, traces))
    all_gather = summary.by_kind["all_gather"]
    assert summary.worst_rank == 0
    assert all_gather.busbw_gbps < 10 and all_gather.transfer_busbw_gbps > 100
    assert all_gather.waiting_ms_per_step > 0.9 * all_gather.ms_per_step
    result = Result.load(folder)
    result.metrics.collectives = _gathered(tmp_path, traces)
    diagnosis = diagnose(traces[0], result)
    assert diagnosis.bottleneck == "collectives" and "waiting for the other ranks to arrive" in diagnosis.headline
    assert "most of it is rank 0 waiting for the other ranks" in diagnosis.headline
    # DDP's ranks arrive together: the figures stand as measured and no wait is named
    folder = RANKS / "ddp__big_gradients"
    summary = GatheredCommunication.from_dict(_gathered(tmp_path, [folder / "trace.json.gz",
                                                                    folder / "trace.rank1.json.gz"]))
    all_reduce = summary.by_kind["all_reduce"]
    assert all_reduce.waiting_ms_per_step < 0.25 * all_reduce.ms_per_step
    assert all_reduce.transfer_busbw_gbps == pytest.approx(all_reduce.busbw_gbps, rel=0.25)

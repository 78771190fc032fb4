"""perflab serve from the command line: scenarios, saved points, Ctrl-C, bad input, diagnosis and report."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.config import RunConfig
from perflab.diagnose import diagnose_path
from perflab.report.build import write_report
from perflab.results import Result
from perflab.serve import ServeConfig, serve

ROOT = Path(__file__).resolve().parent.parent
TINY = ["serve", "--workload", "mlp", "--device", "cpu", "--warmup", "1", "--batcher-max-batch", "8"]
CPU_MLP = RunConfig(workload="mlp", device="cpu", warmup=1)


def test_server_points_are_saved_with_every_setting_and_printed(tmp_path, capsys):
    out = tmp_path / "serve"
    assert main(TINY + ["--qps", "100,200", "--duration", "0.5", "--min-queries", "40", "--schedule-seed", "7",
                        "--gpu-cost-per-hour", "2.5", "--out", str(out)]) == 0
    result = Result.load(out)
    record = result.metrics.serve
    assert record.complete and record.scenario == "server" and record.schedule_seed == 7
    assert result.config.serve["qps"] == "100,200" and result.config.gpu_cost_per_hour == 2.5
    assert [point.offered_qps for point in record.points] == [100.0, 200.0]
    for point in record.points:
        assert set(point.latency_ms) >= {"p50", "p90", "p95", "p99", "p99.9"}
        assert point.cost_per_million_queries == pytest.approx(2.5 / 3600 / point.achieved_qps * 1e6)
    assert record.capacity.batcher_qps_at_max_batch > 1000
    assert record.capacity.dispatch_delay_p99_ms >= 0 and record.settings.harness_late_ms is not None
    assert all(point.dispatch_delay_ms.p99_ms >= 0 and point.harness_late is not None for point in record.points)
    assert result.diagnosis is not None
    printed = capsys.readouterr().out
    assert "perflab serve" in printed and "where the p99 tail goes" in printed and "harness capacity" in printed


def test_offline_takes_full_batches_and_single_stream_one_query_at_a_time(tmp_path):
    offline = serve(CPU_MLP, ServeConfig(scenario="offline", duration_s=0.3, min_queries=64, max_batch=8),
                    tmp_path / "offline")
    point = offline.metrics.serve.points[0]
    assert point.queries >= 64 and point.batch_histogram.get(8, 0) >= point.batches - 1
    single = serve(CPU_MLP, ServeConfig(scenario="single-stream", duration_s=0.3, min_queries=30, max_batch=8),
                   tmp_path / "single")
    point = single.metrics.serve.points[0]
    assert point.queries >= 30 and set(point.batch_histogram) == {1}
    assert point.time_ms["mean"]["queue_wait"] < 0.5, "one query at a time never queues"


def test_serve_report_plots_latency_against_load_batch_fill_and_time(tmp_path):
    out = tmp_path / "serve"
    serve(CPU_MLP, ServeConfig(qps="100,300", duration_s=0.4, min_queries=40, max_batch=8), out)
    files = write_report(out)
    text = files[0].read_text()
    assert "latency vs offered load" in text.lower() and "max batch" in text
    for name in ("serve_latency_vs_load.png", "serve_batch_fill.png", "serve_time_breakdown.png"):
        assert (out / name).stat().st_size > 5000


def test_diagnose_reads_a_serve_result_without_a_trace(tmp_path):
    out = tmp_path / "serve"
    serve(CPU_MLP, ServeConfig(qps="100", duration_s=0.4, min_queries=40, max_batch=8), out)
    diagnosis, result = diagnose_path(out)
    assert result.metrics.serve and diagnosis.source["trace"] is None
    assert main(["diagnose", str(out), "--no-save"]) == 0


def write_training_only(tmp_path: Path) -> Path:
    plugin = tmp_path / "train_only.py"
    plugin.write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\nfrom perflab import Workload\n"
        "def build(cfg):\n"
        "    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))\n"
        "    return Workload(name='train-only', model=torch.nn.Linear(4, 2), dataset=data,\n"
        "                    loss_fn=torch.nn.CrossEntropyLoss(), supports_inference=False)\n")
    return plugin


@pytest.mark.parametrize("flags, says", [
    (["--qps", "0"], "--qps must be positive"),
    (["--qps", "100,-5"], "--qps must be positive"),
    (["--p99-ms", "0"], "--p99-ms must be a positive number"),
    (["--p99-ms", "-3"], "--p99-ms must be a positive number"),
    (["--batcher-max-batch", "0"], "--batcher-max-batch must be a positive integer"),
    (["--mode", "train"], "--mode train cannot be served"),
    (["--qps", "0.001", "--min-queries", "100"], "longer than a point may run"),  # 100,000 s: past a day
    (["--scenario", "offline", "--qps", "100"], "apply to --scenario server"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, flags, says):
    assert main(TINY + flags + ["--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_training_only_workload_is_refused_in_one_line(tmp_path, capsys):
    plugin = write_training_only(tmp_path)
    args = ["serve", "--workload", f"{plugin}:build", "--device", "cpu", "--out", str(tmp_path / "x")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "training-only" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_interrupted_serve_keeps_its_finished_points(tmp_path):
    out = tmp_path / "serve"
    command = [sys.executable, "-m", "perflab", *TINY, "--qps", "60,70,80,90,100,110,120", "--duration", "0.5",
               "--min-queries", "20", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.time() + 120
    points = 0
    while points < 2 and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
        try:
            points = len(json.loads((out / "result.json").read_text())["metrics"]["serve"]["points"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            points = 0
    assert points >= 2, "the serve run did not finish two points in time"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "finished point(s) are kept" in err
    result = Result.load(out)
    record = result.metrics.serve
    assert 2 <= len(record.points) < 7 and not record.complete and result.status == "interrupted"
    assert all(point.completed == point.queries for point in record.points)


@pytest.mark.cuda
def test_gpu_instances_copy_on_their_streams_and_replay_captured_graphs(tmp_path):
    cfg = RunConfig(workload="resnet50", device="cuda", warmup=2, precision="bf16", channels_last=True,
                    cuda_graphs=True, workload_options={"image_res": "64"})
    result = serve(cfg, ServeConfig(qps="200", duration_s=1.0, min_queries=100, max_batch=8, instances=2), tmp_path)
    record = result.metrics.serve
    point = record.points[0]
    assert record.settings.buckets == [1, 2, 4, 8]
    assert point.completed == point.queries and point.gpu is not None
    assert point.time_ms["mean"]["copy_in"] > 0 and point.time_ms["mean"]["copy_out"] > 0
    assert sum(point.time_ms["mean"].values()) == pytest.approx(point.latency_ms["mean"], rel=1e-6)


def test_compare_and_rerun_refuse_a_serve_result_in_one_line(tmp_path, capsys):
    out = tmp_path / "serve"
    serve(CPU_MLP, ServeConfig(qps="100", duration_s=0.3, min_queries=30, max_batch=8), out, command=["perflab", "serve"])
    assert main(["rerun", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a `perflab serve` result" in err and len(err.splitlines()) == 1

"""perflab sweep: grid and auto-batch, saved point by point, OOM recorded, interrupted sweeps resumed."""
import csv
import json

import pytest
import torch

import perflab
import perflab.pipeline
from perflab.cli import main
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.sweep import SweepPoint, best_points, read_points, read_rows, run_auto_batch, run_sweep

TINY = ["--workload", "mlp", "--steps", "3", "--trials", "2", "--warmup", "1", "--device", "cpu"]




def counting_run(monkeypatch, fail=None, throughput=None):
    """Wrap perflab.run: record each point's batch size, raise `fail(cfg)` when it returns an error, and
    optionally overwrite the measured throughput with `throughput(cfg)`."""
    real_run = perflab.pipeline.run
    calls = []

    def fake(workload, config, **kwargs):
        calls.append(config.batch_size)
        error = fail(config) if fail else None
        if error is not None:
            raise error
        result = real_run(workload, config, **kwargs)
        if throughput is not None:
            result.metrics.throughput_samples_per_s.median = throughput(config)
        return result

    monkeypatch.setattr(perflab, "run", fake)
    return calls


def test_sweep_records_every_point_with_its_result_csv_and_plots(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", *TINY, "--batch", "16,32", "--mode", "train,infer", "--max-p95-ms", "1000",
                 "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [row["status"] for row in rows] == ["ok"] * 4
    assert {(row["params"]["batch_size"], row["params"]["mode"]) for row in rows} == \
        {(16, "train"), (16, "infer"), (32, "train"), (32, "infer")}
    for row in rows:
        assert (out / row["dir"] / "result.json").is_file()
    with open(out / "sweep.csv") as stream:
        table = list(csv.DictReader(stream))
    assert [r["label"] for r in table] == [row["label"] for row in rows]
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["best"] == max(rows, key=lambda r: r["throughput"])["key"]
    assert meta["best_under_bound"] is not None
    for name in ("throughput_vs_batch.png", "latency_vs_batch.png", "memory_vs_batch.png"):
        assert (out / name).stat().st_size > 5000


def test_sweep_keeps_finished_points_when_interrupted_and_resume_skips_them(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    args = ["sweep", *TINY, "--batch", "8,16,32,64", "--out", str(out)]
    counting_run(monkeypatch, fail=lambda cfg: KeyboardInterrupt() if cfg.batch_size == 32 else None)
    assert main(args) == 130
    assert [row["params"]["batch_size"] for row in read_rows(out)] == [8, 16]

    calls = counting_run(monkeypatch)
    assert main(args + ["--resume"]) == 0
    assert calls == [32, 64], "finished points must not run again"
    rows = read_rows(out)
    assert [row["params"]["batch_size"] for row in rows] == [8, 16, 32, 64]
    assert len({row["index"] for row in rows}) == 4


def test_sweep_records_out_of_memory_point_and_goes_on(tmp_path, monkeypatch):
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    counting_run(monkeypatch, fail=lambda cfg: oom("CUDA out of memory. Tried to allocate 2 GiB")
                 if cfg.batch_size == 32 else None)
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=b) for b in (16, 32, 64)]
    summary = run_sweep(configs, tmp_path / "sweep", plots=False)
    assert [(point.params["batch_size"], point.status) for point in summary.rows] == \
        [(16, "ok"), (32, "oom"), (64, "ok")]
    assert "out of memory" in summary.rows[1].error
    assert summary.rows[1].dir is None


def test_plain_runtime_error_is_a_bug_not_a_point_status(tmp_path, monkeypatch):
    counting_run(monkeypatch, fail=lambda cfg: RuntimeError("shape mismatch"))
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=16)]
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_sweep(configs, tmp_path / "sweep", plots=False)
    assert not (tmp_path / "sweep" / "sweep.jsonl").exists()
    assert list((tmp_path / "sweep" / "points").iterdir()) == [], "the failed point's folder is removed"


def test_auto_batch_doubles_until_out_of_memory(tmp_path, monkeypatch):
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    calls = counting_run(monkeypatch, fail=lambda cfg: oom("out of memory") if cfg.batch_size >= 64 else None,
                         throughput=lambda cfg: 1000.0 * cfg.batch_size)  # doubling always pays
    base = RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=16)
    summary = run_auto_batch([base], tmp_path / "auto", growth_pct=5.0, plots=False)
    assert calls == [16, 32, 64]
    assert [point.status for point in summary.rows] == ["ok", "ok", "oom"]


def test_auto_batch_stops_when_throughput_stops_growing(tmp_path, monkeypatch):
    gains = {16: 1000.0, 32: 1900.0, 64: 2000.0, 128: 4000.0}  # +90%, then +5.3%: stop below 10%
    calls = counting_run(monkeypatch, throughput=lambda cfg: gains[cfg.batch_size])
    base = RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=16)
    summary = run_auto_batch([base], tmp_path / "auto", growth_pct=10.0, plots=False)
    assert calls == [16, 32, 64]
    assert summary.best.params["batch_size"] == 64


def test_partial_last_line_from_a_kill_is_ignored_and_trimmed_on_resume(tmp_path):
    out = tmp_path / "sweep"
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=b) for b in (16, 32)]
    run_sweep(configs[:1], out, plots=False)
    with open(out / "sweep.jsonl", "a") as stream:
        stream.write('{"index": 1, "key": "abc", "sta')  # killed mid-write
    assert len(read_rows(out)) == 1
    summary = run_sweep(configs, out, resume=True, plots=False)
    assert [point.params["batch_size"] for point in summary.rows] == [16, 32]
    assert all(json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines())


def test_sweep_refuses_to_overwrite_a_sweep_without_resume(tmp_path):
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=16)]
    run_sweep(configs, tmp_path / "sweep", plots=False)
    with pytest.raises(PerflabError, match="--resume"):
        run_sweep(configs, tmp_path / "sweep", plots=False)


def test_best_points_respect_the_latency_bound():
    rows = [{"key": "a", "status": "ok", "throughput": 100.0, "p95_ms": 5.0},
            {"key": "b", "status": "ok", "throughput": 300.0, "p95_ms": 50.0},
            {"key": "c", "status": "oom", "throughput": None, "p95_ms": None},
            {"key": "d", "status": "ok", "throughput": 900.0, "p95_ms": 1.0, "quality": "fail"}]
    best, bounded = best_points([SweepPoint.from_dict(row) for row in rows], max_p95_ms=10.0)
    assert best.key == "b" and bounded.key == "a"
    assert best_points(rows, max_p95_ms=1.0)[1] is None
    best, bounded = best_points(rows, max_p95_ms=10.0)  # rows read as dicts (perflab report) come back as given
    assert best is rows[1] and bounded is rows[0]


def test_a_sweep_point_is_typed_in_memory_and_written_with_the_same_keys(tmp_path):
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=16)]
    summary = run_sweep(configs, tmp_path / "sweep", plots=False)
    point = summary.rows[0]
    assert isinstance(point, SweepPoint) and point.ok and point.throughput > 0 and point.config.batch_size == 16
    written = json.loads((tmp_path / "sweep" / "sweep.jsonl").read_text().splitlines()[0])
    assert {"index", "key", "label", "params", "config", "status", "error", "dir", "throughput", "throughput_ci_low",
            "throughput_ci_high", "trials", "p50_ms", "p95_ms", "p99_ms", "peak_memory_mb", "memory_kind",
            "gpu_util_pct", "mfu_pct", "quality", "quality_reason", "busy", "world_size", "elapsed_s"} <= set(written)
    assert RunConfig.from_dict(written["config"]) == point.config
    assert SweepPoint.from_dict(written) == point


def test_an_old_sweep_line_with_missing_and_unknown_keys_still_loads_and_resumes(tmp_path):
    out = tmp_path / "sweep"
    configs = [RunConfig(workload="mlp", steps=3, trials=2, warmup=1, device="cpu", batch_size=b) for b in (16, 32)]
    run_sweep(configs[:1], out, plots=False)
    line = json.loads((out / "sweep.jsonl").read_text())
    for name in ("busy", "world_size", "quality_reason", "memory_kind", "trials", "elapsed_s"):
        line.pop(name)
    line["config"].pop("nnodes")
    line["config"]["an_option_since_removed"] = 3
    line["a_key_from_elsewhere"] = "kept"
    (out / "sweep.jsonl").write_text(json.dumps(line) + "\n")
    old = read_points(out)[0]
    assert old.busy is False and old.world_size is None and old.config.nnodes == 1
    assert old.extra == {"a_key_from_elsewhere": "kept"} and old.to_dict()["a_key_from_elsewhere"] == "kept"
    summary = run_sweep(configs, out, resume=True, plots=False)
    assert [point.params["batch_size"] for point in summary.rows] == [16, 32]


def test_every_point_failing_is_a_user_error(tmp_path, capsys):
    code = main(["sweep", *TINY, "--workload", "nonexistent", "--batch", "8,16", "--out", str(tmp_path / "s")])
    assert code == 2
    assert "unknown workload" in capsys.readouterr().err


def test_resume_with_only_out_reuses_the_recorded_options(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", *TINY, "--batch", "8,16", "--out", str(out)]) == 0
    jsonl = out / "sweep.jsonl"
    first, second = jsonl.read_text().splitlines()
    jsonl.write_text(first + "\n")  # as if the sweep had been killed during its second point
    assert main(["sweep", "--resume", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [row["params"]["batch_size"] for row in rows] == [8, 16]
    assert rows[0] == json.loads(first), "the finished point was kept, not re-run"
    assert "resuming with the recorded options" in capsys.readouterr().out


def test_resume_of_a_directory_without_a_sweep_is_a_clear_error(tmp_path, capsys):
    assert main(["sweep", "--resume", "--out", str(tmp_path)]) == 2
    assert "holds no sweep" in capsys.readouterr().err

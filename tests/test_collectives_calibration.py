"""perflab calibrate --collectives: bus bandwidth as nccl-tests computes it, measured between 2 gloo ranks and cached."""
import json

import pytest

from perflab.calibrate_collectives import bus_factor, bus_gbps, collective_seconds
from perflab.cli import main


def test_bus_bandwidth_is_algorithm_bandwidth_times_the_ring_factor():
    # nccl-tests: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875) and bus_factor("reduce_scatter", 2) == 0.5
    # 1 GB all-reduced in 10 ms over 8 ranks: algbw 100 GB/s, busbw 175 GB/s
    assert bus_gbps("all_reduce", 1e9, 0.010, 8) == pytest.approx(175.0)
    # and back: 1 GB at 175 GB/s of bus bandwidth plus 20 us of latency
    assert collective_seconds("all_reduce", 1e9, 175.0, 20e-6, 8) == pytest.approx(0.010 + 20e-6)
    assert collective_seconds("all_reduce", 1e9, 175.0, 20e-6, 1) == 0.0


def test_collectives_are_measured_between_two_gloo_ranks_and_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--collectives", "--nproc", "2", "--device", "cpu"]) == 0
    cache = json.loads((tmp_path / "calibration.json").read_text())
    (entry,) = cache.values()
    assert entry["ranks"] == 2 and entry["backend"] == "gloo"
    for kind, rows in entry["results"].items():
        assert [row["bytes"] for row in rows] == [4096, 65536, 2**20]
        for row in rows:
            assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3)
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor(kind, 2))
        assert entry["latency_us"][kind] == rows[0]["time_us"]
    assert "busbw" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--collectives", "--nproc", "1", "--device", "cpu"], "use --nproc 2 or more"),
    (["calibrate", "--nproc", "2", "--device", "cpu"], "add --collectives"),
])
def test_collectives_settings_are_refused_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.device_count() >= 2, reason="needs 2 GPUs (nvidia-h100-x2)")
def test_two_gpus_measure_nccl_bus_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--collectives", "--nproc", "2", "--quick", "--max-mb", "16"]) == 0
    (entry,) = json.loads((tmp_path / "calibration.json").read_text()).values()
    assert entry["backend"] == "nccl" and all(value > 0 for value in entry["peak_busbw_gbps"].values())

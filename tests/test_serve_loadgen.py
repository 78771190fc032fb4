"""`perflab serve --loadgen`: MLCommons LoadGen drives the same batcher and model. perflab's own load generator and
LoadGen agree on a model whose every batch takes a fixed 20 ms: offline throughput within a few percent, and the
same VALID/INVALID verdict on a short and on a long server run. Without the bindings, one line says what to install."""
import sys

import pytest

from perflab.cli import main
from perflab.config import RunConfig
from perflab.serve import ServeConfig, serve
from perflab.serve.capacity import FixedTimeEngine

CPU_MLP = RunConfig(workload="mlp", device="cpu", warmup=1)
SERVICE_S, MAX_BATCH = 0.02, 32  # at most 32 / 0.02 = 1,600 queries/s


def test_without_the_bindings_loadgen_is_refused_in_one_line_saying_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)  # as if not installed: importing it raises
    assert main(["serve", "--workload", "mlp", "--device", "cpu", "--loadgen", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'perflab[loadgen]'" in err and "Traceback" not in err


def fixed_time(tmp_path, name, loadgen, **settings):
    result = serve(CPU_MLP, ServeConfig(p99_ms=100, max_batch=MAX_BATCH, batch_timeout_ms=2, loadgen=loadgen,
                                        **settings), tmp_path / name, engines=[FixedTimeEngine(SERVICE_S)])
    return result.metrics.serve.points[0]


def test_offline_throughput_of_perflab_and_loadgen_agree_within_a_few_percent(tmp_path):
    pytest.importorskip("mlperf_loadgen")
    own = fixed_time(tmp_path, "own", False, scenario="offline", duration_s=1.0, min_queries=500)
    judged = fixed_time(tmp_path, "lg", True, scenario="offline", duration_s=1.0, min_queries=500)
    assert judged.loadgen["validity"] == "VALID" and judged.load_generator == "MLCommons LoadGen"
    assert own.achieved_qps == pytest.approx(MAX_BATCH / SERVICE_S, rel=0.08)
    assert judged.loadgen["samples_per_s"] == pytest.approx(own.achieved_qps, rel=0.05)
    assert (tmp_path / "lg" / "loadgen" / "point-0" / "mlperf_log_summary.txt").is_file()


@pytest.mark.parametrize("duration_s,min_queries,verdict", [(0.5, 100, "INVALID"), (1.5, 600, "VALID")])
def test_perflab_and_loadgen_give_the_same_verdict_on_a_short_and_a_long_server_run(tmp_path, duration_s,
                                                                                   min_queries, verdict):
    """At 400 queries/s (a quarter of capacity) p99 is about two service times, far inside 100 ms: 0.5 s offers
    ~200 queries, too few for early stopping (459), 1.5 s offers ~600, enough."""
    pytest.importorskip("mlperf_loadgen")
    own = fixed_time(tmp_path, "own", False, qps="400", duration_s=duration_s, min_queries=min_queries)
    judged = fixed_time(tmp_path, "lg", True, qps="400", duration_s=duration_s, min_queries=min_queries)
    assert ("VALID" if own.validity.valid else "INVALID") == verdict, own.validity.reasons
    assert judged.loadgen["validity"] == verdict
    assert judged.loadgen["early_stopping_met"] == (verdict == "VALID") == own.validity.early_stopping.met
    assert judged.passed == own.passed == (verdict == "VALID")

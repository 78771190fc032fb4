"""The scaling model of `perflab scale --predict`: its arithmetic on hand-worked cases, and its inputs from a run."""
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from perflab.calibrate_collectives import CollectivesCalibration, PeerLink
from perflab.cli import main
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.sweep.point import ScaleRow
from perflab.sweep.predict import (Interconnect, Link, PredictConfig, Prediction, Recipe, StepBreakdown,
                                   breakdown_of, interconnect, predict, predict_rows, recipe_of)

# One GPU: forward 5 + backward 10 + optimizer 2 + other 1 = 18 ms; 25M parameters (100 MB of fp32 gradients).
STEP = StepBreakdown(forward_ms=5.0, backward_ms=10.0, optimizer_ms=2.0, other_ms=1.0, parameters=25_000_000, units=4)
NVLINK = Link(busbw_gbps=100.0, latency_s=10e-6, source="test")
IB = Link(busbw_gbps=50.0, latency_s=10e-6, source="test")
NETWORK = Interconnect(intra=NVLINK, inter=IB, gpus_per_node=8)


def test_one_gpu_is_the_measured_step():
    one = predict(STEP, Recipe(), NETWORK, 1)
    assert one.step_ms == 18.0 and one.efficiency_pct == 100.0 and one.exposed_ms == 0.0


def test_ddp_on_two_gpus_waits_for_the_last_bucket_only_when_backward_is_long_enough():
    # 100 MB in 25 MiB buckets: ceil(1e8 / 26,214,400) = 4 buckets of 2.5e7 bytes. At 2 GPUs f = 2(2-1)/2 = 1:
    # a bucket takes c = 10 us + 2.5e7 B / 100 GB/s = 10 + 250 = 260 us.
    # exposed = max(c, K c - backward (K-1)/K) = max(260, 1040 - 7500) = 260 us
    two = predict(STEP, Recipe(), NETWORK, 2)
    assert two.detail["buckets"] == 4
    assert two.communication_ms == pytest.approx(1.04)
    assert two.exposed_ms == pytest.approx(0.26)
    assert two.step_ms == pytest.approx(18.26)
    assert two.efficiency_pct == pytest.approx(100 * 18 / 18.26)  # 98.58%


def test_ddp_with_a_short_backward_waits_for_the_whole_queue_of_buckets():
    short = StepBreakdown(5.0, 0.5, 2.0, 1.0, 25_000_000)
    # exposed = max(260, 4 x 260 - 500 x 3/4) = max(260, 1040 - 375) = 665 us
    assert predict(short, Recipe(), NETWORK, 2).exposed_ms == pytest.approx(0.665)


def test_ddp_across_nodes_runs_at_the_slower_link_and_pays_a_tree_of_latencies():
    # 64 GPUs = 8 nodes of 8: busbw min(100, 50) = 50 GB/s; latency 10 us + ceil(log2 8) = 3 levels x 10 us = 40 us;
    # f = 2 x 63/64 = 1.96875; c = 40 us + 2.5e7 x 1.96875 / 5e10 s = 40 + 984.375 = 1024.375 us;
    # exposed = max(1024.375, 4097.5 - 7500) = 1024.375 us; step 19.024375 ms; efficiency 18 / 19.024375 = 94.6%
    wide = predict(STEP, Recipe(), NETWORK, 64)
    assert (wide.nodes, wide.gpus_per_node, wide.busbw_gbps) == (8, 8, 50.0)
    assert wide.exposed_ms == pytest.approx(1.024375)
    assert wide.efficiency_pct == pytest.approx(100 * 18 / 19.024375)


def test_ddp_with_bf16_gradients_sends_half_the_bytes():
    # 5e7 bytes in 2 buckets (ceil(5e7 / 26,214,400) = 2) of 2.5e7 bytes: the same 260 us per bucket, half as many
    bf16 = predict(STEP, Recipe(gradient_dtype="bf16"), NETWORK, 2)
    assert bf16.detail["buckets"] == 2 and bf16.communication_ms == pytest.approx(0.52)


# FSDP: 8M parameters in 4 units of 2M (8 MB in fp32); forward 4 ms (1 ms a unit), backward 8 ms (2 ms a unit)
FSDP_STEP = StepBreakdown(forward_ms=4.0, backward_ms=8.0, optimizer_ms=2.0, other_ms=0.0, parameters=8_000_000,
                          units=4)


def test_fsdp_hides_each_units_gathers_under_the_previous_units_compute():
    # 2 GPUs, f = (2-1)/2: all-gather a = 10 us + 8e6 x 0.5 / 1e11 s = 10 + 40 = 50 us; reduce-scatter r = 50 us.
    # forward: a + 3 x max(0, 50 - 1000) = 50 us; backward: a + 3 x max(0, 100 - 2000) + r = 100 us.
    # the optimizer keeps its 2 ms. step = 4 + 8 + 2 + 0.15 = 14.15 ms; efficiency 14 / 14.15 = 98.9%
    fsdp = predict(FSDP_STEP, Recipe(parallel="fsdp"), NETWORK, 2)
    assert fsdp.detail["all_gather_ms"] == pytest.approx(0.05)
    assert fsdp.exposed_ms == pytest.approx(0.15)
    assert fsdp.step_ms == pytest.approx(14.15)
    assert fsdp.efficiency_pct == pytest.approx(100 * 14 / 14.15)


def test_fsdp_on_a_slow_link_waits_for_every_gather_beyond_the_compute():
    slow = Interconnect(intra=Link(1.0, 10e-6, "test"), inter=IB, gpus_per_node=8)
    # a = r = 10 us + 8e6 x 0.5 / 1e9 s = 4010 us
    # forward: 4010 + 3 x (4010 - 1000) = 13040 us; backward: 4010 + 3 x (8020 - 2000) + 4010 = 26080 us
    resharded = predict(FSDP_STEP, Recipe(parallel="fsdp"), slow, 2)
    assert resharded.detail["exposed_forward_ms"] == pytest.approx(13.04)
    assert resharded.detail["exposed_backward_ms"] == pytest.approx(26.08)
    # the last unit keeps its parameters: no first re-gather; the 3 others still gather: 3 x 6020 + 4010 = 22070 us
    kept = predict(FSDP_STEP, Recipe(parallel="fsdp", kept_units=1), slow, 2)
    assert kept.detail["exposed_backward_ms"] == pytest.approx(22.07)
    # bf16 parameters: a = 10 + 8e6 / 2 x 0.5 / 1e9 s = 2010 us; forward 2010 + 3 x 1010 = 5040 us
    bf16 = predict(FSDP_STEP, Recipe(parallel="fsdp", param_dtype="bf16"), slow, 2)
    assert bf16.detail["exposed_forward_ms"] == pytest.approx(5.04)


def test_the_links_come_from_the_flag_then_the_measurement_then_the_nominal_figure():
    measured = CollectivesCalibration.from_dict({"ranks": 2, "measured_utc": "t",  # an older entry: no results
                                                 "peak_busbw_gbps": {"all_reduce": 300.0},
                                                 "latency_us": {"all_reduce": 20.0}})
    nominal = PeerLink("NVLink 4 (H100 SXM), per direction", 450.0)
    network = interconnect(PredictConfig(predict="8"), measured, nominal)
    assert network.intra.busbw_gbps == 300.0 and network.intra.latency_s == pytest.approx(20e-6)
    assert "measured" in network.intra.source and "stated: 400 Gb/s" in network.inter.source
    assert network.inter.busbw_gbps == 50.0
    assert interconnect(PredictConfig(predict="8"), None, nominal).intra.source.startswith("stated: nominal NVLink 4")
    assert interconnect(PredictConfig(predict="8", intra_node_gbps=7.0), measured, nominal).intra.busbw_gbps == 7.0
    with pytest.raises(PerflabError, match="calibrate --collectives"):
        interconnect(PredictConfig(predict="8"), None, None)


@pytest.mark.parametrize("text, message", [("8,12", "fill whole nodes"), ("0,2", "positive"), ("a", "like 2,8")])
def test_gpu_counts_are_checked(text, message):
    with pytest.raises(PerflabError, match=message):
        PredictConfig(predict=text).counts()


def _result(phases, parameters=25_000_000, layers=4):
    return SimpleNamespace(config=RunConfig(mode="train"), metrics=SimpleNamespace(phases_ms=phases),
                           workload={"parameters": parameters, "info": {"layers": layers}})


def test_the_one_gpu_breakdown_and_the_recipe_come_from_the_run():
    step = breakdown_of(_result({"forward": 5.0, "backward": 10.0, "optimizer": 2.0, "data_wait": 0.5, "h2d": 0.5}))
    assert step == STEP
    recipe = recipe_of(RunConfig(parallel="fsdp", fsdp_param_dtype="bf16", reshard_after_forward=False), 4)
    assert (recipe.param_dtype, recipe.reduce_dtype, recipe.kept_units) == ("bf16", "fp32", 4)
    assert recipe_of(RunConfig(parallel="ddp", ddp_comm_hook="bf16", ddp_bucket_mb=50.0), 4).gradient_dtype == "bf16"


def test_predictions_sit_beside_the_measured_efficiency_of_the_same_recipe():
    rows = [ScaleRow(params={"nproc": gpus}, config=RunConfig(parallel="ddp", nproc=gpus), status="ok",
                     world_size=gpus, efficiency_pct=efficiency) for gpus, efficiency in ((1, 100.0), (2, 97.0))]
    single = _result({"forward": 5.0, "backward": 10.0, "optimizer": 2.0, "other": 1.0})
    predicted = predict_rows(rows, {"g": single}, NETWORK, [8], lambda row: "g")
    assert [(prediction.parallel, prediction.gpus) for prediction in predicted] == [("ddp", 2), ("ddp", 8)]
    assert predicted[0].measured_efficiency_pct == 97.0 and predicted[1].measured_efficiency_pct is None
    # the prediction at the measured 2-GPU point has no point below it to fit a tax from: the model alone, which the
    # measurement then checks; the 8-GPU one carries the tax the 2-GPU point shows (18 / 0.97 - 18 - 0.26 ms)
    assert predicted[0].efficiency_pct == predicted[0].efficiency_without_tax_pct == pytest.approx(100 * 18 / 18.26)
    assert predicted[1].overlap_tax_ms == pytest.approx(18 / 0.97 - 18 - 0.26)
    assert predicted[0].recipe == Recipe(parallel="ddp")


def test_a_prediction_is_written_with_the_same_keys_and_an_old_one_still_loads():
    prediction = predict(STEP, Recipe(), NETWORK, 2)
    written = replace(prediction, recipe=Recipe(), measured_efficiency_pct=97.0).to_dict()
    assert written["recipe"] == {"parallel": "ddp", "bucket_mb": 25.0, "gradient_dtype": "fp32",
                                 "param_dtype": "fp32", "reduce_dtype": "fp32", "kept_units": 0}
    assert Prediction.from_dict(written) == replace(prediction, recipe=Recipe(), measured_efficiency_pct=97.0)
    # a scale.json from before the overlap tax: no tax figures, no recipe's newer settings
    old = {name: value for name, value in written.items()
           if name not in ("overlap_tax_ms", "efficiency_without_tax_pct", "overlap_tax")}
    old["recipe"] = {"parallel": "ddp", "bucket_mb": 25.0}
    loaded = Prediction.from_dict(old)
    assert loaded.overlap_tax_ms == 0.0 and loaded.efficiency_without_tax_pct == loaded.efficiency_pct
    assert loaded.recipe == Recipe()


def test_scale_predicts_ddp_and_fsdp_from_one_gpu_and_prints_the_assumed_links(tmp_path, capsys):
    out = tmp_path / "scale"
    assert main(["scale", "--workload", "transformer", "--option", "size=tiny", "--option", "seq_len=16",
                 "--batch", "2", "--steps", "2", "--warmup", "1", "--trials", "1", "--device", "cpu", "--nproc", "1",
                 "--predict", "2,16", "--intra-node-gbps", "10", "--out", str(out)]) == 0
    scale = json.loads((out / "scale.json").read_text())
    assert {(row["parallel"], row["gpus"]) for row in scale["predictions"]} == {
        ("ddp", 2), ("ddp", 16), ("fsdp", 2), ("fsdp", 16)}
    assert all(row["step_ms"] > 0 for row in scale["predictions"])
    assert "10 GB/s" in scale["assumptions"]["within a node"]
    printed = capsys.readouterr().out
    assert "scaling model" in printed and "assumed, between nodes: stated: 400 Gb/s" in printed
    assert "overlap tax, ddp: none: no multi-GPU point measured" in printed
    assert all(row["overlap_tax_ms"] == 0.0 for row in scale["predictions"])


def test_model_settings_without_predict_are_refused_in_one_line(capsys):
    assert main(["scale", "--workload", "mlp", "--nproc", "1", "--device", "cpu", "--gpus-per-node", "4"]) == 2
    assert "add --predict" in capsys.readouterr().err


def test_predict_without_a_bus_bandwidth_is_refused_before_any_point_runs(tmp_path, capsys):
    out = tmp_path / "scale"
    assert main(["scale", "--workload", "mlp", "--device", "cpu", "--nproc", "1", "--predict", "8",
                 "--out", str(out)]) == 2
    assert "--predict needs the bus bandwidth" in capsys.readouterr().err
    assert not (out / "sweep.jsonl").exists()  # nothing ran


def test_the_one_rank_point_at_100_percent_and_a_rounding_over_it_are_not_over_the_ceiling():
    from perflab.sweep.scale import over_ceiling
    assert not over_ceiling(100.00000000000001) and not over_ceiling(100.0) and not over_ceiling(None)
    assert over_ceiling(100.5) and over_ceiling(100.001)

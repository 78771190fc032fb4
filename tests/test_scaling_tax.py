"""The scaling model's overlap tax: fitted from the measured multi-GPU points below each predicted count (held from
one, a line in the overlapped communication from two), and named by where it came from."""
from types import SimpleNamespace

import pytest

from perflab.sweep.overlap_tax import NO_MULTI_GPU_POINT, NO_TAX, fit_overlap_tax, tax_point
from perflab.config import RunConfig
from perflab.sweep.point import ScaleRow
from perflab.sweep.predict import (Interconnect, Link, Prediction, Recipe, StepBreakdown, overlap_tax_of,
                                   predict, predict_rows)

# One GPU: forward 5 + backward 10 + optimizer 2 + other 1 = 18 ms; 25M parameters (100 MB of fp32 gradients),
# DDP's 25 MiB buckets: 4 buckets of 2.5e7 bytes; 100 GB/s and 10 us within a node.
STEP = StepBreakdown(forward_ms=5.0, backward_ms=10.0, optimizer_ms=2.0, other_ms=1.0, parameters=25_000_000, units=4)
NETWORK = Interconnect(intra=Link(100.0, 10e-6, "test"), inter=Link(50.0, 10e-6, "test"), gpus_per_node=8)
# The 2-GPU point measured a 18.65 ms step: 18 / 18.65 = 96.51%
MEASURED_AT_2 = 100 * 18 / 18.65


def _rows(*measured: tuple[int, float]) -> list[ScaleRow]:
    return [ScaleRow(params={"nproc": gpus}, config=RunConfig(parallel="ddp", nproc=gpus), status="ok",
                     world_size=gpus, efficiency_pct=efficiency, dir=f"points/{gpus}")
            for gpus, efficiency in [(1, 100.0), *measured]]


def _predicted(rows, counts=(4,), exposed_of=None) -> dict[int, Prediction]:
    single = SimpleNamespace(config=RunConfig(mode="train"), workload={"parameters": 25_000_000, "info": {"layers": 4}},
                             metrics=SimpleNamespace(phases_ms={"forward": 5.0, "backward": 10.0, "optimizer": 2.0,
                                                                "other": 1.0}))
    out = predict_rows(rows, {"g": single}, NETWORK, list(counts), lambda row: "g", exposed_of=exposed_of)
    assert {prediction.parallel for prediction in out} <= {"ddp", "fsdp"}
    return {prediction.gpus: prediction for prediction in out if prediction.parallel == "ddp"}


def test_the_tax_fitted_at_two_gpus_is_held_at_four_and_the_two_gpu_prediction_has_none():
    # At 2 GPUs (f = 1): a bucket c = 10 us + 2.5e7 B / 100 GB/s = 260 us; communication 4 x 260 = 1040 us;
    # exposed = max(260, 1040 - 10000 x 3/4) = 260 us. Measured step 18.65 ms: tax = 18.65 - 18 - 0.26 = 0.39 ms.
    # At 4 GPUs (f = 2 x 3/4 = 1.5): c = 10 + 375 = 385 us; communication 1540 us; exposed = max(385, 1540 - 7500)
    # = 385 us; step(4) = 18 + 0.385 + 0.39 = 18.775 ms; efficiency 18 / 18.775 = 95.87% (without the tax 18 / 18.385
    # = 97.91%). The 2-GPU prediction has no point below it: the model alone, a check of its own.
    predicted = _predicted(_rows((2, MEASURED_AT_2)))
    two, four = predicted[2], predicted[4]
    assert two.overlap_tax_ms == 0.0 and two.overlap_tax == NO_MULTI_GPU_POINT
    assert two.efficiency_pct == pytest.approx(100 * 18 / 18.26)
    assert four.exposed_ms == pytest.approx(0.385)
    assert four.overlap_tax_ms == pytest.approx(0.39)
    assert four.step_ms == pytest.approx(18.775)
    assert four.efficiency_pct == pytest.approx(100 * 18 / 18.775)
    assert four.efficiency_without_tax_pct == pytest.approx(100 * 18 / 18.385)


def test_the_prediction_names_the_point_the_tax_was_fitted_from():
    source = _predicted(_rows((2, MEASURED_AT_2)))[4].overlap_tax
    assert source == ("fitted from the 2-GPU point: +0.39 ms/step, held at every count (the 2-GPU point grew "
                      "0.65 ms/step, the model's exposed 0.26 ms)")


def test_a_measured_count_is_predicted_from_the_points_below_it_and_a_larger_one_from_a_line_through_both():
    # 4 GPUs measured at 90%: step 20 ms, grew 2 ms, the model's exposed 0.385: tax 1.615 ms at 1.155 ms overlapped;
    # 2 GPUs: 0.39 ms at 0.78 ms overlapped. Least squares: slope 3.267, intercept 0.39 - 3.267 x 0.78 < 0, so a line
    # through the origin: slope = (0.78 x 0.39 + 1.155 x 1.615) / (0.78^2 + 1.155^2) = 2.169525 / 1.942425.
    # At 8 GPUs (f = 1.75): c = 10 + 437.5 = 447.5 us, communication 1790 us, exposed 447.5 us, overlapped 1342.5 us.
    predicted = _predicted(_rows((2, MEASURED_AT_2), (4, 90.0)), counts=(8,))
    assert predicted[4].overlap_tax.startswith("fitted from the 2-GPU point")  # the 4-GPU point checks, not fits
    assert predicted[4].measured_efficiency_pct == 90.0
    assert predicted[4].efficiency_pct == pytest.approx(100 * 18 / 18.775)
    slope = 2.169525 / 1.942425
    assert predicted[8].overlap_tax_ms == pytest.approx(slope * 1.3425)
    assert predicted[8].overlap_tax.startswith("fitted from the 2 and 4-GPU points: +0.00 ms/step + 1.12 ms per ms")


def test_a_tax_that_falls_from_two_to_four_gpus_is_held_at_the_four_gpu_point():
    # FSDP2 on 4x H200 grew less at 4 GPUs than at 2: the line would fall, so the larger count's tax is held
    at_four = 100 * 18 / (18 + 0.385 + 0.2)  # tax 0.2 ms at 4 GPUs, 0.39 at 2
    predicted = _predicted(_rows((2, MEASURED_AT_2), (4, at_four)), counts=(8,))
    assert predicted[8].overlap_tax_ms == pytest.approx(0.2)
    assert "did not grow with the overlapped communication; held at the 4-GPU point's +0.20 ms/step" in \
        predicted[8].overlap_tax


def test_with_only_one_gpu_measured_there_is_no_tax_and_the_prediction_says_so():
    predicted = _predicted(_rows(), counts=(2, 4))  # DDP and FSDP2 at their defaults; the DDP rows here
    for row in predicted.values():
        assert row.overlap_tax == NO_MULTI_GPU_POINT == "none: no multi-GPU point measured"
        assert row.overlap_tax_ms == 0.0 and row.efficiency_pct == row.efficiency_without_tax_pct
    assert predicted[4].efficiency_pct == pytest.approx(100 * 18 / 18.385)


def test_a_point_faster_than_the_model_fits_no_tax():
    # 18.1 ms measured at 2 GPUs: growth 0.1 ms, below the model's 0.26 ms exposed
    row = _predicted(_rows((2, 100 * 18 / 18.1)))[4]
    assert row.overlap_tax_ms == 0.0
    assert row.overlap_tax.startswith("none: fitted from the 2-GPU point: the 2-GPU point grew 0.10 ms/step")


def test_a_profiled_point_fits_the_tax_beyond_its_measured_exposed_communication():
    # profiled exposed 0.5 ms: tax(2) = 18.65 - 18 - 0.5 = 0.15 ms, held at 4
    predicted = _predicted(_rows((2, MEASURED_AT_2)), exposed_of=lambda row: 0.5 if row.world_size == 2 else None)
    assert predicted[4].overlap_tax_ms == pytest.approx(0.15)
    assert "profiled exposed 0.50 ms" in predicted[4].overlap_tax


def test_one_point_gives_a_fixed_tax_at_every_count_above_one_gpu():
    tax = fit_overlap_tax([tax_point(single_step_ms=18.0, gpus=2, measured_efficiency_pct=90.0, communication_ms=1.0,
                                     exposed_ms=1.0)])
    # measured step 20 ms: tax = 20 - 18 - 1 = 1 ms, whatever the overlap at another count; none at 1 GPU
    assert tax.ms_at(8, 5.0) == pytest.approx(1.0) and tax.ms_at(1, 5.0) == 0.0
    assert "held at every count" in tax.source
    assert fit_overlap_tax([]) is NO_TAX


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_with_a_large_tax_the_efficiency_stays_within_zero_and_one_hundred(parallel):
    recipe = Recipe(parallel=parallel)
    tax = overlap_tax_of(STEP, recipe, NETWORK, {2: 50.0}, {})
    for gpus in (1, 2, 4, 8, 64, 512):
        efficiency = predict(STEP, recipe, NETWORK, gpus, tax).efficiency_pct
        assert 0 < efficiency <= 100
    assert predict(STEP, recipe, NETWORK, 1, tax).efficiency_pct == 100.0


def _prediction(**figures) -> Prediction:
    """A prediction with the figures a test names, the others filler."""
    return Prediction(**{"gpus_per_node": 8, "nodes": 1, "step_ms": 18.0, "communication_ms": 1.0, "exposed_ms": 0.2,
                         "busbw_gbps": 100.0, **figures})


def test_the_distributed_bench_prints_the_four_gpu_check_last(monkeypatch, capsys):
    from benchmarks.bench_distributed import Summary, rank_counts
    monkeypatch.setenv("BENCH_DISTRIBUTED_NPROC", "1,2,4")
    assert rank_counts() == [1, 2, 4]
    summary = Summary()
    summary.add("transformer-1b ddp", 4, 40.0, 90.0, None, 91.0)
    fitted = "fitted from the 2-GPU point: +13.00 ms/step"
    summary.model_check.add("transformer-1b", [
        _prediction(parallel="ddp", gpus=2, measured_efficiency_pct=91.1, efficiency_pct=91.1),
        _prediction(parallel="ddp", gpus=4, measured_efficiency_pct=90.0, efficiency_pct=89.0,
                    efficiency_without_tax_pct=99.9, overlap_tax_ms=15.2, overlap_tax=fitted),
        _prediction(parallel="ddp", gpus=8, measured_efficiency_pct=None, efficiency_pct=88.0),
        _prediction(parallel="fsdp", gpus=4, measured_efficiency_pct=86.8, efficiency_pct=88.0,
                    efficiency_without_tax_pct=99.2, overlap_tax_ms=20.0, overlap_tax=fitted)])
    summary.print()
    printed = capsys.readouterr().out
    check = printed[printed.index("scaling model check"):]
    assert printed.index("summary") < printed.index("scaling model check")  # the check is the last table
    lines = check.splitlines()[2:]
    assert [line.split("|")[1].strip() for line in lines] == ["ddp", "fsdp"]
    assert "90.0%" in lines[0] and "89.0%" in lines[0] and "-1.0 points" in lines[0] and "99.9%" in lines[0]
    assert "+1.2 points" in lines[1] and fitted in lines[1]


def test_a_tax_change_within_the_points_own_uncertainty_is_held_not_fitted_as_a_slope():
    # resnet50 on 4x H200: the tax moved +0.24 ms from 2 to 4 GPUs with each point's throughput +/-2% (about 1.3 ms
    # of a 58 ms step): a line through them would have carried 2.1 ms per ms of overlapped communication past one
    # node, a slope made of noise
    near = [tax_point(18.0, 2, 100 * 18 / 18.65, 1.04, 0.26, uncertainty=0.02),
            tax_point(18.0, 4, 100 * 18 / (18 + 0.385 + 0.45), 1.54, 0.385, uncertainty=0.02)]
    held = fit_overlap_tax(near)
    assert held.per_overlapped_ms == 0.0 and held.fixed_ms == pytest.approx(0.45)
    assert "within their own uncertainty" in held.source
    # the same two points measured tightly: the change is real, and a line is fitted
    tight = [tax_point(18.0, 2, 100 * 18 / 18.65, 1.04, 0.26, uncertainty=0.0001),
             tax_point(18.0, 4, 100 * 18 / (18 + 0.385 + 0.45), 1.54, 0.385, uncertainty=0.0001)]
    assert fit_overlap_tax(tight).per_overlapped_ms > 0

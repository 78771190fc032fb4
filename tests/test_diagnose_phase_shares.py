"""The phase-shares rule: a result without a trace still names the phase outside the model that holds the step."""
import pytest

from perflab.bottlenecks import H2D_COPIES, INPUT_PIPELINE, LAUNCH_OVERHEAD
from perflab.config import RunConfig
from perflab.diagnose import diagnose_result
from perflab.diagnose.findings import Context
from perflab.diagnose.phase_shares import phase_shares
from test_tune import fake_result


def result_with(shares, **config):
    cfg = RunConfig(workload="mlp", mode="train", batch_size=8, steps=4, device="cuda", **config)
    result = fake_result(cfg, 100.0)
    result.metrics.phase_share_pct = shares
    result.metrics.phases_ms = {phase: share / 10 for phase, share in shares.items()}
    return result


def test_an_optimizer_step_holding_half_the_step_names_the_foreach_and_fused_optimizers():
    diagnosis = diagnose_result(result_with({"forward": 20.0, "backward": 29.0, "optimizer": 51.0}))
    finding = diagnosis.findings[0]
    assert finding.cls == LAUNCH_OVERHEAD and finding.levers == ["fused-optimizer", "foreach-optimizer"]
    assert finding.expected_gain_pct == pytest.approx(51.0) and "51% of the step" in finding.summary
    assert diagnosis.bottleneck == LAUNCH_OVERHEAD  # confident enough to be named: 0.3 + 0.51


@pytest.mark.parametrize("shares, config, cls, first", [
    ({"data_wait": 40.0, "forward": 60.0}, {"workers": 0}, INPUT_PIPELINE, "workers"),
    ({"h2d": 35.0, "forward": 65.0}, {"pin_memory": False}, H2D_COPIES, "pin-memory"),
])
def test_the_wait_for_data_and_a_pageable_copy_name_their_classes_levers(shares, config, cls, first):
    finding = diagnose_result(result_with(shares, **config)).findings[0]
    assert finding.cls == cls and finding.levers[0] == first


def test_the_largest_phase_over_its_threshold_is_named_and_a_step_of_model_work_names_none():
    finding = diagnose_result(result_with({"data_wait": 12.0, "optimizer": 30.0, "forward": 58.0})).findings[0]
    assert finding.cls == LAUNCH_OVERHEAD  # 30% optimizer over 12% data wait
    assert diagnose_result(result_with({"forward": 40.0, "backward": 45.0, "optimizer": 15.0})).findings == []
    assert diagnose_result(result_with({"data_wait": 9.0, "forward": 91.0})).findings == []


def test_the_rule_leaves_a_result_with_a_trace_to_the_trace_rules():
    ctx = Context(trace=None, profile=object(), result=result_with({"optimizer": 60.0, "forward": 40.0}))
    assert phase_shares(ctx) is None


def test_a_lever_already_on_is_not_proposed_again():
    result = result_with({"optimizer": 60.0, "forward": 40.0}, optimizer_impl="foreach")
    result.levers = ["foreach-optimizer"]  # as a run records the levers it applied
    finding = diagnose_result(result).findings[0]
    assert "foreach-optimizer" not in finding.levers and finding.levers == ["fused-optimizer"]

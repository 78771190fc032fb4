"""Who spends the host's time: a built-in call of the user's code (torch.tensor of a Python list) that makes the host
slower than the GPU is named before the launch levers, with its frame and share; framework calls are not."""
from pathlib import Path

import pytest

from perflab.diagnose import diagnose
from perflab.diagnose.host_calls import host_calls
from perflab.diagnose.summary import summarize
from perflab.diagnose.trace import load_trace

TRACES = Path(__file__).parent / "fixtures" / "traces"


def _calls(name: str):
    trace = load_trace(TRACES / name)
    profile = summarize(trace, None)
    return host_calls(trace, profile.start_us, profile.end_us, profile.steps), profile


def test_a_tensor_built_from_a_python_list_every_layer_is_the_hosts_largest_call():
    calls, profile = _calls("runtime/pageable_async_copy.json.gz")  # recorded on an H200, 12 layers a step
    top = calls[0]
    assert top.call == "tensor" and top.caller.endswith("pageable_async_copy.py(23): forward")
    assert top.calls_per_step == 12
    assert 100 * top.ms_per_step / profile.step_ms == pytest.approx(24, abs=2)
    assert all(call.ms_per_step < 0.2 * top.ms_per_step for call in calls[1:])


def test_the_launch_finding_names_the_call_first_and_its_removal_as_the_first_move():
    diagnosis = diagnose(TRACES / "runtime/pageable_async_copy.json.gz")
    assert diagnosis.headline.startswith("the host spends 24% of the step in tensor() at ")
    assert diagnosis.advice[0].startswith("in tests/planted/pageable_async_copy.py(23): forward: tensor() takes 24%")
    assert diagnosis.evidence["expected_gain_by_lever_pct"] == {"code: tensor() out of the step": pytest.approx(24, abs=1)}


@pytest.mark.parametrize("name", ["gpu/launch__tiny_ops.json.gz", "gpu/launch__single_tensor_adam.json.gz",
                                  "runtime/empty_cache_loss.json.gz", "gpu/sync__tolist_loss.json.gz"])
def test_no_call_is_named_where_the_host_time_is_launching_or_framework_code(name):
    calls, profile = _calls(name)
    assert all(100 * call.ms_per_step / profile.step_ms < 5 for call in calls)
    assert "the host spends" not in diagnose(TRACES / name).headline

"""One declaration of the step's phases: what the loop times, what the trace marks and the order reports use."""
from pathlib import Path

from perflab.diagnose.trace import load_trace
from perflab.step.phases import MARKED_PHASES, PHASE_ORDER, marker_name, phase_sort_key
from perflab.results.metrics import Metrics
from perflab.report.markdown import _phase_rows
from perflab.results import Result

FIXTURES = Path(__file__).parent / "fixtures" / "traces" / "cpu"


def test_every_phase_a_run_records_is_declared():
    for path in FIXTURES.glob("*.result.json"):
        assert set(Result.load(path).metrics.phases_ms) <= set(PHASE_ORDER), path.name


def test_the_trace_marks_phases_by_their_declared_marker_names():
    trace = load_trace(FIXTURES / "input_pipeline__cpu_loader.json.gz")
    names = {trace.annotations.names[i] for i in trace.annotations.name_id}
    assert {marker_name("data_wait"), "forward", "backward", "optimizer"} <= names
    assert {marker_name("data_wait"), "forward"} <= set(MARKED_PHASES)


def test_reports_list_phases_in_step_order_and_unknown_ones_last():
    metrics = Metrics(phases_ms={"unattributed": 0.1, "my_phase": 0.2, "optimizer": 1.0, "forward": 2.0,
                                 "data_wait": 0.5})
    assert [row[0] for row in _phase_rows(metrics)] == ["data_wait", "forward", "optimizer", "unattributed",
                                                         "my_phase"]
    assert sorted(["checkpoint", "h2d"], key=phase_sort_key) == ["h2d", "checkpoint"]

"""perflab serve calls the model by the rule `perflab run` uses (dict batches as keywords, tuples as positional
arguments; dataclass outputs), shows a failing forward as run does (what perflab was doing, the user's frames,
exit 2) and never passes NaN/inf outputs (the result is invalid, exit 1)."""

from perflab.cli import main
from tests.cli_process import ROOT, load, perflab_cli

PLUGIN = "tests/plugins/dict_model.py"
SHORT = ["--device", "cpu", "--warmup", "1", "--batcher-max-batch", "4", "--duration", "0.5", "--min-queries", "40"]


def test_the_default_driving_workload_is_served_with_its_dict_batches(tmp_path):
    """DrivingModel.forward(images, command): serve called it with the dict as one argument and crashed."""
    out = tmp_path / "driving"
    # about 19 samples/s in full batches on a 2-core CPU: 8 queries/s is well within it
    assert main(["serve", "--device", "cpu", "--warmup", "1", "--batcher-max-batch", "4", "--duration", "2",
                 "--min-queries", "16", "--qps", "8", "--out", str(out)]) == 0
    result = load(out)
    assert result["config"]["workload"] == "driving"
    point = result["metrics"]["serve"]["points"][0]
    assert point["completed"] == point["queries"] >= 16


def test_a_keyword_input_plugin_with_a_dataclass_output_is_served(tmp_path):
    out = tmp_path / "plugin"
    assert main(["serve", "--workload", PLUGIN, "--option", "inputs=dict", "--option", "output=dataclass", *SHORT,
                 "--qps", "200", "--out", str(out)]) == 0
    assert load(out)["metrics"]["serve"]["points"][0]["completed"] >= 40
    tuple_out = tmp_path / "tuple"
    assert main(["serve", "--workload", PLUGIN, "--option", "inputs=tuple", "--option", "output=tuple", *SHORT,
                 "--scenario", "offline", "--out", str(tuple_out)]) == 0


def test_a_forward_that_raises_under_serve_shows_the_users_frame_and_no_perflab_traceback(tmp_path):
    done = perflab_cli("serve", "--workload", PLUGIN, "--option", "fail=forward", *SHORT, "--qps", "200",
                       "--out", str(tmp_path / "fails"))
    assert done.returncode == 2, done.stderr
    assert "calling your model's forward on a batch of type dict with keys input_ids, attention_mask raised " \
           "ValueError: planted failure in forward" in done.stderr
    line = next(number for number, text in enumerate((ROOT / PLUGIN).read_text().splitlines(), 1)
                if 'raise ValueError("planted failure in forward")' in text)
    assert f"dict_model.py:{line}" in done.stderr
    assert "Traceback" not in done.stderr and str(ROOT / "perflab") not in done.stderr


def test_nan_outputs_make_the_serve_result_invalid_with_a_one_line_reason(tmp_path):
    out = tmp_path / "nan"
    done = perflab_cli("serve", "--workload", PLUGIN, "--option", "fail=nan", *SHORT, "--qps", "200,400",
                       "--out", str(out))
    assert done.returncode == 1, done.stderr
    reason = [line for line in done.stderr.splitlines() if line.startswith("invalid run:")]
    assert len(reason) == 1 and "NaN/inf" in reason[0], done.stderr
    result = load(out)
    assert result["status"] == "invalid" and "NaN/inf" in result["status_reason"]
    points = result["metrics"]["serve"]["points"]
    assert len(points) == 1, "a diverged model is not served at further rates"
    assert not points[0]["validity"]["valid"] and any("NaN/inf" in r for r in points[0]["validity"]["reasons"])

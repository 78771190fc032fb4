"""The quality gate's verdict and serve's search records as typed data (perflab/results/quality.py, results/metrics.py):
read as attributes, written to result.json with the keys they had, read back leniently from older files."""
import json
import math
from pathlib import Path

import pytest

from perflab.errors import PerflabError
from perflab.results import Result
from perflab.results.metrics import Capacity, Search, Serve
from perflab.results.quality import (GenerationFigures, LossFigures, OutputFigures, QualityVerdict, Tolerance,
                                     verdict_of)

ROOT = Path(__file__).resolve().parents[1]


def stored_results() -> list[Path]:
    return sorted(path for folder in ("docs", "benchmarks", "tests/fixtures") for path in (ROOT / folder).rglob(
        "result.json"))


def same_json(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN-safe


def test_every_stored_result_writes_its_quality_and_serve_records_back_unchanged():
    checked = 0
    for path in stored_results():
        raw = json.loads(path.read_text())
        written = Result.load(path).to_dict()
        assert same_json(written["quality"], raw.get("quality")), path
        serve = (raw.get("metrics") or {}).get("serve")
        if serve:
            again = written["metrics"]["serve"]
            for key in ("search", "capacity"):
                assert same_json(again.get(key), serve.get(key)), (path, key)
            assert same_json([p.get("validity") for p in again["points"]],
                             [p.get("validity") for p in serve["points"]]), path
        checked += raw.get("quality") is not None
    assert checked >= 5


def test_a_verdict_is_read_as_attributes_with_its_figures_typed_by_kind():
    infer = QualityVerdict.from_dict({"verdict": "pass", "reason": "ok", "metrics": {"rel_error": 1e-3},
                                      "tolerances": {"rtol": 2e-2, "source": "bf16 default"},
                                      "candidate": {"levers": ["bf16"], "precision": "bf16"}, "batches": 3})
    assert isinstance(infer.metrics, OutputFigures) and infer.metrics.rel_error == 1e-3
    assert infer.tolerances == Tolerance(rtol=2e-2, source="bf16 default") and infer.candidate.levers == ["bf16"]
    assert infer.passed and not infer.failed and infer.batches == 3
    train = QualityVerdict.from_dict({"verdict": "fail", "metrics": {"final_loss_candidate": math.nan}})
    assert isinstance(train.metrics, LossFigures) and math.isnan(train.metrics.final_loss_candidate)
    generate = QualityVerdict.from_dict({"verdict": "pass", "metrics": {"greedy_agreement": 1.0, "vocab": 512}})
    assert isinstance(generate.metrics, GenerationFigures) and generate.metrics.vocab == 512


def test_an_old_verdict_missing_keys_reads_with_defaults_and_keeps_keys_it_does_not_know():
    old = QualityVerdict.from_dict({"verdict": "inconclusive", "from_the_future": {"x": 1}})
    assert old.reason == "" and old.metrics is None and old.tolerances is None and old.inconclusive
    assert old.to_dict() == {"verdict": "inconclusive", "reason": "", "from_the_future": {"x": 1}}
    assert verdict_of(None) == "not checked" and verdict_of(old) == "inconclusive"


def test_a_training_tolerance_with_a_non_finite_noise_floor_still_says_so():
    tolerance = Tolerance(rtol=1e-2, source="bf16 default", precision_rtol=1e-2, noise_floor=None, widening=1.0)
    assert tolerance.to_dict()["noise_floor"] is None
    assert "noise_floor" not in Tolerance(rtol=1e-2, source="bf16 default").to_dict()


def test_a_quality_record_that_is_not_an_object_is_one_perflab_error():
    with pytest.raises(PerflabError, match="quality record is not a JSON object"):
        QualityVerdict.from_dict("pass")


def test_a_result_made_with_a_json_shaped_verdict_holds_it_typed():
    result = Result(config={}, environment={}, workload={}, trials=[], metrics={},
                    quality={"verdict": "fail", "reason": "NaN"})
    assert isinstance(result.quality, QualityVerdict) and result.quality.failed
    assert result.to_dict()["quality"] == {"verdict": "fail", "reason": "NaN"}


def test_serve_search_and_capacity_are_typed_and_keep_their_keys():
    record = {"search": {"lowest_failing_qps": 400.0, "tolerance": 0.05, "start_qps": 100.0,
                         "tried": [{"qps": 100.0, "passed": True}, {"qps": 400.0, "passed": False}]},
              "capacity": {"batcher_qps_at_max_batch": 9000.0, "batcher_batches_per_s": 3000.0,
                           "loadgen_issue_qps": 5000.0}}  # a capacity from before arrivals were virtual
    serve = Serve.from_dict(record)
    assert isinstance(serve.search, Search) and [t.passed for t in serve.search.tried] == [True, False]
    assert isinstance(serve.capacity, Capacity) and serve.capacity.dispatch_delay_p99_ms is None
    written = serve.to_dict()
    assert written["search"] == record["search"] and written["capacity"] == record["capacity"]
    skipped = Search(skipped="one query alone takes too long", tolerance=0.05).to_dict()
    assert skipped == {"skipped": "one query alone takes too long", "tried": [], "lowest_failing_qps": None,
                       "tolerance": 0.05, "start_qps": None}


def _observed(values):
    import torch
    from perflab.quality.outputs import Observed
    return [Observed([torch.tensor(values, dtype=torch.float64)])]


def test_an_output_over_the_fp32_tolerance_passes_when_fp32_eager_itself_is_as_far_from_float64():
    from perflab.quality.outputs import FP64_MULTIPLIER, judge_outputs, with_fp64_reference, fp64_errors
    from perflab.results.quality import Tolerance
    exact = _observed([1.0, 2.0, 3.0])
    eager = _observed([1.0 + 4e-5, 2.0, 3.0])  # a deep chain: eager fp32 rounds by 1.1e-5 of the output's norm
    close = _observed([1.0, 2.0 - 3e-5, 3.0])  # another rounding of the same size: 1.3e-5 from eager, over 1e-5
    assert judge_outputs(eager, close, 1e-5, "fp32 default", False).verdict == "fail"
    tolerance = with_fp64_reference(Tolerance(rtol=1e-5, source="fp32 default"), fp64_errors(eager, close, exact))
    assert tolerance.rtol == pytest.approx(FP64_MULTIPLIER * 4e-5 / 14 ** 0.5, rel=1e-3)
    assert tolerance.precision_rtol == 1e-5 and "float64" in tolerance.source
    verdict = judge_outputs(eager, close, tolerance.rtol, tolerance.source, False,
                            fp64_errors=fp64_errors(eager, close, exact))
    assert verdict.verdict == "pass" and "against float64" in verdict.reason
    assert verdict.metrics.fp64_error_candidate == pytest.approx(3e-5 / 14 ** 0.5, rel=1e-3)


def test_a_candidate_further_from_float64_than_twice_fp32_eager_still_fails():
    from perflab.quality.outputs import fp64_errors, with_fp64_reference
    from perflab.results.quality import Tolerance
    exact = _observed([1.0, 2.0, 3.0])
    eager = _observed([1.0 + 1e-7, 2.0, 3.0])  # eager is accurate: 2.7e-8 from float64
    worse = _observed([1.0, 2.0 + 5e-5, 3.0])  # a compiled sin of lower accuracy: 1.3e-5
    tolerance = with_fp64_reference(Tolerance(rtol=1e-5, source="fp32 default"), fp64_errors(eager, worse, exact))
    assert tolerance.rtol == 1e-5 and tolerance.source == "fp32 default"  # not widened


@pytest.mark.slow
def test_the_gate_reads_an_over_tolerance_candidate_against_a_float64_run_of_the_baseline():
    from perflab.config import RunConfig
    from perflab.quality.gate import run_model_gate
    from perflab.quality.outputs import FP64_MULTIPLIER
    from perflab.workloads import load_workload
    import torch
    cfg = RunConfig(workload="tests/planted/elementwise_chain.py:build", mode="infer", batch_size=4, device="cpu",
                    compile="default", check_quality=True, quality_steps=2)
    verdict = run_model_gate(load_workload(cfg.workload, cfg), cfg, torch.device("cpu"))
    figures = verdict.metrics
    if figures.rel_error <= 1e-5:  # inside fp32's tolerance: no float64 run needed
        assert verdict.verdict == "pass" and figures.fp64_error_candidate is None
    else:  # over it (CPU Inductor's vectorised sin measured 1.4e-5): the float64 run decides, and is recorded
        assert figures.fp64_error_candidate is not None and "against float64" in verdict.reason
        within = figures.fp64_error_candidate <= FP64_MULTIPLIER * figures.fp64_error_baseline
        assert verdict.verdict == ("pass" if within else "fail"), verdict.reason

"""perflab tune --objective max-qps: serve trials judged by max QPS against the search's resolution, the quality
gate, the serve recipe; bad input; and serve's own quality gate."""
import json
from pathlib import Path

import pytest

from perflab import options
from perflab.cli import main
from perflab.config import RunConfig
from perflab.diagnose.verdict import Diagnosis
from perflab.results.metrics import LoadPoint, ServeSettings
from perflab.results import Result
from perflab.serve import ServeConfig, serve
from perflab.tune import tune
from perflab.tune.objective import judge_max_qps
from perflab.tune.recipe import recipe
from perflab.tune.settings import TuneConfig
from perflab.tune.trial import OK, QUALITY_FAIL, TrialOutcome, trial_command

START = RunConfig(workload="mlp", mode="infer", warmup=1, device="cpu")
# 500 queries a point: a search passes only VALID points, and early stopping needs 459 on time for a p99
SERVE = ServeConfig(p99_ms=50.0, duration_s=0.2, min_queries=500, max_batch=8)
TOLERANCE = 0.05  # the serve search's resolution: 5%
TINY_TUNE = ["tune", "--workload", "mlp", "--device", "cpu", "--warmup", "1", "--quality-steps", "2"]


def serve_result(cfg: RunConfig, max_qps, quality: str = "pass") -> Result:
    """A serve result whose max-QPS search found `max_qps` (None: no rate met the bound) at 5% resolution."""
    points = [] if max_qps is None else [{"offered_qps": max_qps, "passed": True, "achieved_qps": max_qps,
                                          "latency_ms": {"p99": 40.0}, "batch_fill_pct": 50.0}]
    record = {"max_qps": max_qps, "points": points, "single_query_ms": 1.0,
              "search": {"tolerance": TOLERANCE, "tried": [], "lowest_failing_qps": None}}
    return Result(config={**cfg.to_dict(), "batch_size": 8}, environment={}, workload={}, trials=[],
                  metrics={"serve": record}, quality={"verdict": quality, "reason": f"planted quality {quality}"})


def profile_result(cfg: RunConfig) -> Result:
    metrics = {"throughput_samples_per_s": {"median": 1000.0}, "latency_ms": {"p50": 8.0, "p99": 8.0}}
    return Result(config=cfg.to_dict(), environment={}, workload={}, trials=[], metrics=metrics)


class FakeServeTrials:
    """No processes: a serve trial's max QPS is 1000 q/s times a factor per option value; profiles are stubs."""

    def __init__(self, factors, failing_quality=()):
        self.factors, self.failing_quality = factors, failing_quality
        self.calls: list[tuple[str, str, object]] = []

    def __call__(self, cfg: RunConfig, kind: str, out: Path, time_limit_s=None, serve=None) -> TrialOutcome:
        self.calls.append((kind, out.name, serve))
        out.mkdir(parents=True, exist_ok=True)
        if kind == "profile":
            result = profile_result(cfg)
            result.save(out)
            (out / "trace.json").write_text("{}")
            return TrialOutcome(OK, 1.0, result=Result.load(out))
        max_qps = 1000.0
        for (option, value), factor in self.factors.items():
            if getattr(cfg, option) == value:
                max_qps *= factor
        failing = any(getattr(cfg, option) == value for option, value in self.failing_quality)
        serve_result(cfg, max_qps, "fail" if failing else "pass").save(out)
        return TrialOutcome(QUALITY_FAIL if failing else OK, 1.0, result=Result.load(out))


def compute_bound(*levers) -> Diagnosis:
    finding = dict(cls="compute bound", confidence=0.9, levers=list(levers), summary="", evidence={}, advice=[])
    return Diagnosis(bottleneck="compute bound", confidence=0.9, headline="planted", evidence={}, levers=list(levers),
                     advice=[], findings=[finding], profile={})


def tune_max_qps(tmp_path, trials, diagnosis, **settings) -> dict:
    config = TuneConfig(**{"budget": "10m", "objective": "max-qps", "serve": SERVE, "max_trials": 3, **settings})
    return tune(START, config, tmp_path / "tune", runner=trials, check_workload=False, cpu_count=8, report=None,
                diagnoser=lambda trace, result, lost: diagnosis)


def bf16_link(summary: dict) -> dict:
    return next(link for link in summary["chain"] if link["label"] == "bf16")


# ---------------------------------------------------------------------------------------------- decisions

def test_max_qps_gain_inside_the_search_resolution_is_not_kept(tmp_path):
    summary = tune_max_qps(tmp_path, FakeServeTrials({("precision", "bf16"): 1.04}), compute_bound("bf16"))
    link = bf16_link(summary)
    assert not link["kept"] and link["verdict"] == "no significant change"
    assert link["max_qps"] == pytest.approx(1040.0) and link["against_max_qps"] == 1000.0
    assert link["resolution_pct"] == pytest.approx(5.0) and "resolution (5%)" in link["why"]
    assert summary["kept"] == [] and summary["best"]["max_qps"] == 1000.0


def test_max_qps_gain_beyond_the_resolution_with_quality_pass_is_kept(tmp_path):
    trials = FakeServeTrials({("precision", "bf16"): 1.3})
    summary = tune_max_qps(tmp_path, trials, compute_bound("bf16"))
    link = bf16_link(summary)
    assert link["kept"] and link["verdict"] == "accept" and link["quality"] == "pass"
    assert link["objective"] == "max-qps" and link["measured_gain_pct"] == pytest.approx(30.0)
    assert summary["speedup"] == pytest.approx(1.3) and summary["best"]["max_qps"] == pytest.approx(1300.0)
    # measured trials are serve trials with the serve settings; the diagnosis still reads a profile
    kinds = [kind for kind, _, _ in trials.calls]
    assert kinds[:3] == ["serve", "profile", "serve"]
    assert all(settings.p99_ms == 50.0 and settings.find_max_qps for kind, _, settings in trials.calls
               if kind == "serve")
    assert summary["objective"]["name"] == "max-qps" and summary["objective"]["p99_ms"] == 50.0
    recipe = summary["recipe"]
    assert recipe["command"].startswith("perflab serve --workload mlp --mode infer")
    assert "--precision bf16" in recipe["command"] and "--find-max-qps --p99-ms 50.0" in recipe["command"]
    assert recipe["snippet"].startswith("serve(RunConfig(") and "ServeConfig(" in recipe["snippet"]
    saved = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert saved["chain"][0]["against_max_qps"] == 1000.0


def test_max_qps_candidate_that_fails_the_quality_gate_is_rejected(tmp_path):
    trials = FakeServeTrials({("precision", "bf16"): 2.0}, failing_quality=[("precision", "bf16")])
    link = bf16_link(tune_max_qps(tmp_path, trials, compute_bound("bf16")))
    assert not link["kept"] and link["verdict"] == "reject" and link["quality"] == "fail"
    assert "quality gate" in link["why"]


class QueueBoundServeTrials(FakeServeTrials):
    """Serve trials whose records show a busy instance and an idle GPU (the inference-queue rule proposes one more
    instance); a second instance raises the max QPS by `second_instance`, a third changes nothing."""

    def __init__(self, second_instance: float):
        super().__init__({})
        self.second_instance = second_instance

    def __call__(self, cfg, kind, out, time_limit_s=None, serve=None) -> TrialOutcome:
        outcome = super().__call__(cfg, kind, out, time_limit_s, serve)
        if kind != "serve":
            return outcome
        max_qps = 1000.0 * (self.second_instance if serve.instances >= 2 else 1.0)
        result = serve_result(cfg, max_qps)
        tail = {"queue_wait": 30.0, "batch_formation": 1.0, "dispatch_delay": 0.1, "copy_in": 0.2, "compute": 8.0,
                "copy_out": 0.1}
        failing = {"scenario": "server", "offered_qps": 1.2 * max_qps, "achieved_qps": 1.1 * max_qps,
                   "completed": 500, "harness_late": False, "meets_bound": False, "passed": False,
                   "latency_ms": {"p99": 60.0}, "time_ms": {"mean": tail, "tail": tail}, "batch_fill_pct": 60.0,
                   "batch_mean": 4.8, "instance_busy_pct": 95.0, "gpu": {"util_mean_pct": 40.0}}
        result.metrics.serve.points.append(LoadPoint.from_dict(failing))
        result.metrics.serve.settings = ServeSettings(max_batch=8, batch_timeout_ms=2.0, p99_ms=50.0,
                                                      instances=serve.instances, buckets=None, bucket_step=16)
        result.save(out)
        return TrialOutcome(OK, 1.0, result=Result.load(out))


def test_max_qps_tune_tries_the_serve_settings_the_queue_diagnosis_proposes_once_no_lever_is_left(tmp_path):
    trials = QueueBoundServeTrials(second_instance=1.4)
    summary = tune_max_qps(tmp_path, trials, compute_bound(), max_trials=30, exclude=[
        name for name in ("bf16", "tf32", "fp16", "channels-last", "compile", "cudnn-benchmark", "cuda-graphs")])
    settings_links = [link for link in summary["chain"] if link["lever"] == "instances"]
    assert [link["label"] for link in settings_links] == ["instances=2", "instances=3"]
    assert settings_links[0]["kept"] and not settings_links[1]["kept"]  # a third instance: inside the resolution
    assert settings_links[0]["proposed_by"] == "inference queue"
    assert summary["best"]["max_qps"] == pytest.approx(1400.0)
    assert "--instances 2" in summary["recipe"]["command"] and "instances=2" in summary["recipe"]["snippet"]
    serve_calls = [settings for kind, _, settings in trials.calls if kind == "serve"]
    assert [settings.instances for settings in serve_calls][-2:] == [2, 3], [link["label"] for link in summary["chain"]]


def test_judge_max_qps_needs_more_than_both_the_resolution_and_the_minimum_effect():
    cfg = START
    best = serve_result(cfg, 1000.0)
    assert judge_max_qps(best, serve_result(cfg, 1060.0), 2.0).kept
    assert not judge_max_qps(best, serve_result(cfg, 1060.0), 8.0).kept  # --min-effect-pct 8 is the larger bar
    lower = judge_max_qps(best, serve_result(cfg, 800.0), 2.0)
    assert lower.verdict == "reject" and lower.gain_pct == pytest.approx(-20.0)
    nothing = judge_max_qps(best, serve_result(cfg, None), 2.0)
    assert not nothing.kept and "no rate met the p99 bound" in nothing.why


def test_levers_serve_does_not_take_are_skipped_with_the_reason(tmp_path):
    loader_bound = Diagnosis(bottleneck="input pipeline", confidence=0.9, headline="planted", evidence={},
                             levers=["workers"], advice=[], profile={},
                             findings=[dict(cls="input pipeline", confidence=0.9, levers=["workers"], summary="",
                                            evidence={}, advice=[])])
    summary = tune_max_qps(tmp_path, FakeServeTrials({}), loader_bound)
    assert "not an option of perflab serve" in summary["skipped"]["workers=2"]
    assert not any(link["lever"] == "workers" for link in summary["chain"])


def test_a_serve_trial_runs_perflab_serve_with_the_serve_options_and_settings(tmp_path):
    cfg = RunConfig(workload="mlp", mode="infer", steps=7, precision="bf16", device="cpu", check_quality=True)
    command = trial_command(cfg, "serve", tmp_path / "t", ServeConfig(p99_ms=20.0, max_batch=4, find_max_qps=True))
    line = " ".join(command)
    assert command[2:4] == ["perflab", "serve"] and "--precision bf16 " in line and "--check-quality" in line
    assert "--find-max-qps --p99-ms 20.0" in line and "--batcher-max-batch 4" in line
    assert "--steps" not in line  # not a serve option


# ---------------------------------------------------------------------------------------------- end to end

def test_tune_max_qps_on_mlp_serves_every_measured_trial_and_records_qps(tmp_path, capsys):
    out = tmp_path / "tune"
    assert main([*TINY_TUNE, "--mode", "infer", "--objective", "max-qps", "--p99-ms", "50", "--batcher-max-batch", "8",
                 "--duration", "0.5", "--min-queries", "500", "--exclude", "compile", "--max-trials", "3",
                 "--budget", "60s", "--out", str(out)]) == 0
    meta = json.loads((out / "tune.json").read_text())
    assert meta["objective"]["name"] == "max-qps" and meta["start"]["max_qps"] > 0
    # The live profile of a tiny mlp on a busy 2-core CI machine is sometimes diagnosed as input pipeline, whose
    # levers serve cannot take: then nothing is tried and the stop reason says so (the decision rules are
    # covered with a fake runner above); otherwise every candidate is a serve search with its quality gate.
    if not meta["chain"]:
        assert "no lever left" in meta["stop_reason"]
    for link in meta["chain"]:
        assert link["max_qps"] and link["against_max_qps"] == meta["start"]["max_qps"]
        assert link["resolution_pct"] == 5.0 and link["verdict"] and link["why"]
        assert link["quality"] in ("pass", "fail")  # every candidate runs serve's quality gate
    assert (out / "trials" / "01-profile-start" / "trace.json").is_file()
    assert "perflab serve" in (out / "trials" / "00-start.log").read_text().splitlines()[0]
    assert meta["recipe"]["command"].startswith("perflab serve --workload mlp")
    printed = capsys.readouterr().out
    assert "q/s at p99 ≤ 50 ms" in printed and "max q/s" in printed
    assert "q/s at p99 ≤ 50 ms" in (out / "report.md").read_text()


# ---------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, says", [
    (["--mode", "infer", "--objective", "max-qps"], "--objective max-qps needs --p99-ms"),
    (["--mode", "infer", "--p99-ms", "20"], "--p99-ms applies to --objective max-qps"),
    (["--objective", "max-qps", "--p99-ms", "20", "--mode", "train"], "add --mode infer"),
    (["--objective", "max-qps", "--p99-ms", "0", "--mode", "infer"], "--p99-ms must be a positive number"),
    (["--objective", "max-qps", "--p99-ms", "20", "--mode", "infer", "--max-p99-ms", "5"], "the latency bound is"),
    (["--objective", "max-qps", "--p99-ms", "20", "--mode", "infer", "--batch", "8"], "give it instead of --batch"),
])
def test_bad_objective_input_is_one_line_and_exit_2(argv, says, capsys, tmp_path):
    assert main(["tune", "--workload", "mlp", "--out", str(tmp_path / "t"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "t").exists()


# ---------------------------------------------------------------------------------------------- serve's gate

def test_serve_records_a_quality_verdict_for_a_numerics_changing_lever(tmp_path):
    cfg = RunConfig(workload="mlp", device="cpu", warmup=1, precision="bf16", quality_steps=2)
    result = serve(cfg, ServeConfig(scenario="offline", duration_s=0.1, min_queries=16, max_batch=8), tmp_path / "s")
    assert result.quality.verdict == "pass" and result.quality.candidate.precision == "bf16"
    assert Result.load(tmp_path / "s").quality.verdict == "pass"
    plain = serve(RunConfig(workload="mlp", device="cpu", warmup=1),
                  ServeConfig(scenario="offline", duration_s=0.1, min_queries=16, max_batch=8), tmp_path / "p")
    assert plain.quality is None  # no lever changes numerics: no gate unless --check-quality asks


def test_serve_exits_1_and_keeps_the_result_when_its_quality_gate_fails(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["serve", "--workload", "mlp", "--device", "cpu", "--warmup", "1", "--batcher-max-batch", "8",
                 "--scenario", "offline", "--duration", "0.1", "--min-queries", "16", "--precision", "bf16",
                 "--check-quality", "--quality-steps", "2", "--quality-rtol", "1e-9", "--out", str(out)]) == 1
    assert Result.load(out).quality.verdict == "fail"
    assert "quality gate failed" in capsys.readouterr().out


@pytest.mark.cuda
def test_tune_max_qps_on_cuda_serves_each_candidate_and_skips_what_serve_cannot_take(tmp_path):
    out = tmp_path / "tune"
    assert main(["tune", "--workload", "mlp", "--device", "cuda", "--mode", "infer", "--warmup", "2",
                 "--quality-steps", "2", "--objective", "max-qps", "--p99-ms", "10", "--batcher-max-batch", "64",
                 "--duration", "0.5", "--min-queries", "500", "--exclude", "compile", "--budget", "90s",
                 "--out", str(out)]) == 0
    meta = json.loads((out / "tune.json").read_text())
    # on the H100 (2026-11-23) mlp's diagnosis left no lever serve takes once compile was excluded: an empty
    # chain with its reason is a valid outcome; every trial that did run must have been a serve search
    assert meta["start"]["max_qps"] > 0 and meta["stop_reason"]
    for link in meta["chain"]:
        log = (out / (link["dir"] + ".log")).read_text().splitlines()[0]
        assert " perflab serve " in log and "--find-max-qps" in log
        assert link["status"] != "ok" or (link["max_qps"] is not None and link["quality"] in ("pass", "fail"))
    assert meta["recipe"]["command"].startswith("perflab serve")


def test_resume_reuses_serve_trials_only_under_the_same_serve_settings(tmp_path):
    first = FakeServeTrials({("precision", "bf16"): 1.3})
    tune_max_qps(tmp_path, first, compute_bound("bf16"))
    again = FakeServeTrials({("precision", "bf16"): 1.3})
    tune_max_qps(tmp_path, again, compute_bound("bf16"), resume=True)
    assert again.calls == []  # every trial recorded: nothing runs twice
    other_bound = FakeServeTrials({("precision", "bf16"): 1.3})
    config = TuneConfig(budget="10m", objective="max-qps", serve=ServeConfig(p99_ms=20.0), max_trials=3, resume=True)
    tune(START, config, tmp_path / "tune", runner=other_bound, check_workload=False, cpu_count=8, report=None,
         diagnoser=lambda trace, result, lost: compute_bound("bf16"))
    assert [kind for kind, _, _ in other_bound.calls if kind == "serve"]  # another bound: measured again


# ---------------------------------------------------------------------------------------------- every run option

class StartCaptured(Exception):
    """Raised by the stand-in for tune(): the CLI accepted the options and built the start and settings."""


# Free-text options have no choices to pick from; every other option's value is derived from its declaration.
TEXT_VALUES = {"workload": "mlp", "draft": "drafts.py:build_draft", "slo": "ttft:200,tpot:50",
               "rdzv_endpoint": "localhost:29500"}
# what an option needs beside it: one the option table cannot state (RunConfig.validate), and one it states (Requires)
COMPANIONS = {"draft": ["--speculative", "2"], "quantize_kernel": ["--quantize", "int8-weight"]}


def given_words(declared) -> list[str]:
    """How a user gives `declared` a valid value other than its default, for a max-qps tune (inference)."""
    if declared.name == "mode":
        return ["--mode", "infer"]  # the one mode serve measures
    if declared.key_value:
        return [declared.flag, "hidden=16"]
    if declared.switch:
        return ["--no-" + declared.flag[2:]] if declared.default is True else [declared.flag]
    if declared.choices:
        return [declared.flag, next(choice for choice in declared.choices if choice != declared.default)]
    if declared.type is int:
        return [declared.flag, str(max(declared.default or 0, int(declared.minimum or 0)) + 1)]
    if declared.type is float:
        return [declared.flag, str((declared.default or 0) + 1.5)]
    if declared.name not in TEXT_VALUES:
        pytest.fail(f"{declared.flag}: give this free-text option an example value in TEXT_VALUES")
    return [declared.flag, TEXT_VALUES[declared.name]]


def contains(argv: list[str], words: list[str]) -> bool:
    return any(argv[i:i + len(words)] == words for i in range(len(argv)))


def start_of_tune(argv: list[str], monkeypatch) -> tuple[RunConfig, TuneConfig]:
    """The start and settings `perflab tune` builds from `argv` (the search itself is not run)."""
    def captured(start, settings, out, **_):
        raise StartCaptured(start, settings)
    monkeypatch.setattr("perflab.cli.tune.tune", captured)
    with pytest.raises(StartCaptured) as captured_info:
        main(argv)
    return captured_info.value.args


MAX_QPS_TUNE = ["tune", "--workload", "mlp", "--mode", "infer", "--objective", "max-qps"]


@pytest.mark.parametrize("declared", [o for o in options.options_of(RunConfig) if "tune" in o.commands],
                         ids=lambda o: o.name)
def test_tune_max_qps_carries_each_run_option_into_its_serve_trials_or_refuses_it(declared, tmp_path, capsys,
                                                                                    monkeypatch):
    words = given_words(declared)
    argv = [*MAX_QPS_TUNE, "--p99-ms", "20", "--out", str(tmp_path / "t"), *COMPANIONS.get(declared.name, []), *words]
    if "serve" not in declared.commands:  # the option table says perflab serve does not take it
        assert main(argv) == 2, declared.flag
        err = capsys.readouterr().err.strip()
        assert declared.flag in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert not (tmp_path / "t").exists()
        return
    start, settings = start_of_tune(argv, monkeypatch)
    assert contains(trial_command(start, "serve", tmp_path / "trial", settings.serve), words)
    assert contains(recipe(start, start, settings.serve).argv, words)


@pytest.mark.parametrize("declared", [o for o in options.options_of(ServeConfig) if "tune" in o.commands],
                         ids=lambda o: o.name)
def test_tune_max_qps_passes_each_serve_setting_to_its_serve_trials(declared, tmp_path, monkeypatch):
    words = given_words(declared)
    p99 = [] if declared.name == "p99_ms" else ["--p99-ms", "20"]
    start, settings = start_of_tune([*MAX_QPS_TUNE, *p99, *words], monkeypatch)
    assert contains(trial_command(start, "serve", tmp_path / "trial", settings.serve), words)
    assert contains(recipe(start, start, settings.serve).argv, words)

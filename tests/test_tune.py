"""perflab tune's search, decisions, budget and journal, with fake trials and diagnoses (no processes)."""
import json
from pathlib import Path

import pytest
import torch

from perflab.cli import main
from perflab.config import RunConfig
from perflab.diagnose.verdict import Diagnosis
from perflab.errors import PerflabError
from perflab.levers import all_levers
from perflab.results.metrics import Interference
from perflab.results import Result, Trial
from perflab.tune import candidates as search
from perflab.report.build import write_report
from perflab.tune import tune
from perflab.tune.decision import judge
from perflab.tune.settings import TuneConfig, parse_duration, strict_tolerances
from perflab.tune.trial import OK, OOM, REFUSED, TrialOutcome, classify, profile_capture
from perflab.workloads import load_workload

START = RunConfig(workload="mlp", mode="train", batch_size=8, steps=4, warmup=1, trials=3, device="cpu")
LEVERS = {lever.name: lever for lever in all_levers()}


def fake_result(cfg: RunConfig, throughput: float, quality: str = "pass") -> Result:
    """A Result with three steady trials around `throughput` samples/s (spread ±1%)."""
    trials = []
    for factor in (0.99, 1.0, 1.01):
        value = throughput * factor
        step_ms = 1000 * cfg.batch_size / value
        trials.append(Trial(wall_s=cfg.steps * step_ms / 1000, steps=cfg.steps, samples=cfg.steps * cfg.batch_size,
                            throughput_samples_per_s=value, step_ms=[step_ms] * cfg.steps,
                            phase_ms={"forward": step_ms}))
    step = 1000 * cfg.batch_size / throughput
    metrics = {"throughput_samples_per_s": {"median": throughput, "ci95_low": throughput * 0.99,
                                            "ci95_high": throughput * 1.01},
               "latency_ms": {"p50": step, "p95": step, "p99": step, "mean": step},
               "phases_ms": {"forward": step}, "memory": {"host_peak_rss_mb": 100.0 * cfg.batch_size},
               "warmup_s": 0.1}
    return Result(config=cfg.to_dict(), environment={}, workload={}, trials=trials, metrics=metrics,
                  quality={"verdict": quality, "reason": f"quality {quality}"})


def diagnosis_of(*findings, bottleneck=None, confidence=None) -> Diagnosis:
    findings = [dict(cls=cls, confidence=conf, levers=levers, summary="", evidence={}, advice=[], **extra)
                for cls, conf, levers, *rest in findings for extra in [rest[0] if rest else {}]]
    top = findings[0] if findings else None
    return Diagnosis(bottleneck=bottleneck or (top["cls"] if top else "no clear bottleneck"),
                     confidence=confidence if confidence is not None else (top["confidence"] if top else 0.5),
                     headline="planted", evidence={}, levers=top["levers"] if top else [], advice=[],
                     findings=findings, profile={})


class FakeTrials:
    """Runs no process: throughput = 100 samples/s times a factor per option value; records every call."""

    def __init__(self, factors, wall_s=1.0, statuses=None, interrupt_at=None):
        self.factors, self.wall_s, self.statuses = factors, wall_s, statuses or {}
        self.interrupt_at = interrupt_at
        self.calls: list[tuple[str, str]] = []
        self.limits: list = []  # each call's time limit (None: none)

    def throughput(self, cfg: RunConfig) -> float:
        value = 100.0
        for (option, option_value), factor in self.factors.items():
            if getattr(cfg, option) == option_value:
                value *= factor
        return value

    def __call__(self, cfg: RunConfig, kind: str, out: Path, time_limit_s=None) -> TrialOutcome:
        self.limits.append(time_limit_s)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        self.calls.append((kind, out.name))
        out.mkdir(parents=True, exist_ok=True)
        for (option, option_value), status in self.statuses.items():
            if getattr(cfg, option) == option_value and kind == "run":
                return TrialOutcome(status, self.wall_s, reason=f"planted {status}")
        result = fake_result(cfg, self.throughput(cfg))
        result.save(out)
        if kind == "profile":
            (out / "trace.json").write_text("{}")
        return TrialOutcome(OK, self.wall_s, result=Result.load(out))


def run_tuner(tmp_path, trials, diagnosis, start=START, report=False, screening=False, **settings):
    """A tune over fake trials; the one-stage search (every candidate in full at once, as max-qps tunes) unless
    `screening` (tests/test_tune_screening.py covers the two stages)."""
    config = TuneConfig(**{"budget": "10m", **settings})
    return tune(start, config, tmp_path / "tune", runner=trials, check_workload=False, cpu_count=8, report=write_report if report else None,
                screening=screening,
                diagnoser=lambda trace, result, lost: diagnosis(lost) if callable(diagnosis) else diagnosis)


# ---------------------------------------------------------------------------------------------- ordering

def test_confident_diagnosis_proposes_its_leading_finding_then_the_other_levers_for_that_class():
    diagnosis = diagnosis_of(("input pipeline", 0.9, ["workers", "prefetch-factor"]), ("compute bound", 0.4, ["bf16"]))
    names = [p.lever for p in search.proposals(diagnosis, LEVERS)]
    assert names[:2] == ["workers", "prefetch-factor"]
    assert "augment-gpu" in names and "bf16" not in names  # same class next; not the unsure second finding


def test_unsure_diagnosis_adds_other_findings_then_levers_addressing_their_classes():
    diagnosis = diagnosis_of(("launch / framework overhead", 0.55, ["compile"]), ("compute bound", 0.4, ["bf16"]))
    names = [p.lever for p in search.proposals(diagnosis, LEVERS)]
    assert names[:2] == ["compile", "bf16"]
    assert "foreach-optimizer" in names and "workers" not in names  # addresses launch overhead; input does not


def test_unsure_diagnosis_weighs_findings_by_the_share_of_the_step_they_explain():
    diagnosis = diagnosis_of(("compute bound", 0.9, ["bf16"], {"expected_gain_pct": 10.0}),
                             ("input pipeline", 0.6, ["workers"], {"expected_gain_pct": 60.0}))
    unsure = search.proposals(diagnosis, LEVERS, unsure_below=0.95)
    assert unsure[0].lever == "workers" and unsure[0].expected_share_pct == 60.0
    confident = search.proposals(diagnosis, LEVERS, unsure_below=0.5)
    assert confident[0].lever == "bf16" and "workers" not in [p.lever for p in confident]  # the verdict leads


def test_no_clear_bottleneck_falls_back_to_every_lever():
    names = [p.lever for p in search.proposals(diagnosis_of(), LEVERS)]
    assert set(names) == set(LEVERS)


def test_numeric_knobs_are_searched_not_guessed():
    workers = LEVERS["workers"]
    assert search.ladder_rungs(workers, 0, 16) == [2, 4, 8, 16]
    assert search.ladder_rungs(workers, 0, 12) == [2, 4, 8, 12]  # the CPU count itself is the last rung
    assert search.ladder_rungs(workers, 2, 6) == [4, 6]
    assert search.ladder_rungs(workers, 0, 1) == [1]
    assert search.ladder_rungs(workers, 16, 16) == []
    proposal = search.Proposal("compile", "launch / framework overhead", 0.8, None)
    cuda = START.replace(device="cuda")
    modes = [c.value for c in search.expand(proposal, LEVERS["compile"], cuda, 8)]
    assert modes == ["default", "reduce-overhead", "max-autotune"]  # launching is the finding: graphs first
    assert [c.value for c in search.expand(proposal, LEVERS["compile"], START, 8)] == ["default"]
    assert search.expand(proposal, LEVERS["compile"], START, 8)[0].apply(START).warmup == 2  # compiling stays out
    prefetch = search.Proposal("prefetch-factor", "input pipeline", 0.8, None)
    assert [c.value for c in search.expand(prefetch, LEVERS["prefetch-factor"], START.replace(workers=2), 8)] == [4, 8]


def test_batch_bisects_between_the_largest_that_ran_and_the_oom():
    assert search.bisect_batch(64, 128) == 96
    assert search.bisect_batch(64, 72) is None


def test_compile_estimates_come_from_a_measured_compile_not_constants(tmp_path):
    # before anything compiled: default's trial is the measurement (stopped at the budget left), the rest unknown
    assert search.compile_trial_cost_s("default", 10.0, None) == 10.0
    assert search.compile_trial_cost_s("max-autotune", 10.0, None) is None
    assert "unknown" in search.compile_over_budget("max-autotune", 10.0, None, 1000.0)
    assert search.compile_trial_cost_s("max-autotune", 10.0, 20.0) == 310.0  # a plain trial + 15 x 20 s
    assert "needs about 310 s" in search.compile_over_budget("max-autotune", 10.0, 20.0, 100.0)
    compile_bound = diagnosis_of(("launch / framework overhead", 0.9, ["compile"]))
    roomy = run_tuner(tmp_path / "roomy", FakeTrials({("compile", "default"): 1.5}), compile_bound, budget="5m")
    assert roomy["kept"][0] == "compile=default"


# ---------------------------------------------------------------------------------------------- decisions

def test_judge_keeps_a_significant_gain_and_rejects_a_slower_or_failing_candidate():
    base = fake_result(START, 100.0)
    assert judge(base, fake_result(START, 150.0), 2.0).kept
    slower = judge(base, fake_result(START, 70.0), 2.0)
    assert not slower.kept and slower.verdict == "reject"
    failing = judge(base, fake_result(START, 150.0, quality="fail"), 2.0)
    assert not failing.kept and "quality gate" in failing.why
    bounded = judge(base, fake_result(START, 150.0), 2.0, max_p99_ms=1.0)
    assert not bounded.kept and "--max-p99-ms" in bounded.why


def test_strict_quality_halves_the_tolerance_of_the_precision():
    assert strict_tolerances(START.replace(precision="bf16")) == {"quality_loss_rtol": 0.005}
    assert strict_tolerances(START.replace(mode="infer", precision="bf16")) == {"quality_rtol": 0.01}


def test_trial_exit_codes_are_classified(tmp_path):
    assert classify(2, "error: --channels-last refused: no convolutions", tmp_path, 1.0).status == REFUSED
    assert classify(1, "RuntimeError: CUDA out of memory. Tried", tmp_path, 1.0).status == OOM
    assert classify(1, "Traceback\nValueError: boom", tmp_path, 1.0).reason == "ValueError: boom"
    for steps in (1, 2, 4, 30):  # the profile's schedule fits in the trial's timed steps
        schedule = profile_capture(steps)
        assert schedule.steps_needed <= steps and schedule.active >= 1


# ---------------------------------------------------------------------------------------------- the loop

def test_the_worker_ladder_goes_past_one_losing_rung_and_stops_after_two_in_a_row(tmp_path):
    # as driving on the H100: 2 workers lose to the main process's many threads, 4 and 8 win, 16 loses
    trials = FakeTrials({("workers", 2): 0.7, ("workers", 4): 2.0, ("workers", 8): 5.0, ("workers", 16): 0.5})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("input pipeline", 0.9, ["workers"])), max_trials=20)
    tried = [link["label"] for link in summary["chain"] if link["label"].startswith("workers")]
    assert tried == ["workers=2", "workers=4", "workers=8"]  # 16 is past the CPU count of 8
    assert summary["kept"] == ["workers=4", "workers=8"]
    lost_twice = FakeTrials({("workers", 2): 0.7, ("workers", 4): 0.8, ("workers", 8): 5.0})
    summary = run_tuner(tmp_path / "b", lost_twice, diagnosis_of(("input pipeline", 0.9, ["workers"])), max_trials=20)
    assert [link["label"] for link in summary["chain"] if link["label"].startswith("workers")] == \
        ["workers=2", "workers=4"] and "workers" in summary["lost"]


def test_a_levers_refusal_is_confirmed_on_the_workload_built_for_the_candidates_settings():
    # driving sets its batched gpu_augment only when built with augment=gpu: the start's build would refuse it
    start = RunConfig(workload="driving", mode="train", batch_size=2, device="cuda",
                      workload_options={"image_res": "32"})
    built = {}

    def workload_for(cfg):
        key = None if cfg is None else cfg.augment
        if key not in built:
            built[key] = load_workload(start.workload, cfg or start)
        return built[key]

    candidate = search.Candidate(search.Proposal("augment-gpu", "input pipeline", None, None), "augment", "gpu",
                                 search.ONCE)
    lever, cfg = LEVERS["augment-gpu"], start.replace(augment="gpu")
    assert lever.checks(cfg, workload_for(None), torch.device("cpu"))  # the start's build refuses it
    assert search.refusal_before_trying(candidate, cfg, lever, workload_for) is None
    assert set(built) == {None, "gpu"}
    mlp = RunConfig(workload="mlp", mode="train", batch_size=2, device="cuda", augment="gpu")
    refused = search.refusal_before_trying(candidate, mlp, lever, lambda cfg: load_workload("mlp", cfg or mlp))
    assert "declares no augmentations" in refused
    # an option no build reads: the start's build decides, no second build (a user's may take minutes)
    builds = []

    def counted(cfg):
        builds.append(cfg)
        return load_workload("mlp", RunConfig(workload="mlp", data="device"))

    workers = search.Candidate(search.Proposal("workers", "input pipeline", None, None), "workers", 4, search.LADDER)
    device_data = RunConfig(workload="mlp", mode="train", batch_size=2, device="cuda", data="device", workers=4)
    assert search.refusal_before_trying(workers, device_data, LEVERS["workers"], counted)
    assert builds == [None]


def test_tune_keeps_the_winner_rejects_the_loser_and_never_retries_it(tmp_path):
    trials = FakeTrials({("precision", "bf16"): 0.7, ("workers", 2): 2.0, ("workers", 4): 4.0})
    seen_lost = []

    def diagnosis(lost):
        seen_lost.append(list(lost))
        return diagnosis_of(("input pipeline", 0.55, ["bf16", "workers"]))

    summary = run_tuner(tmp_path, trials, diagnosis, max_trials=20, report=True)
    labels = [link["label"] for link in summary["chain"]]
    assert labels.count("bf16") == 1
    assert summary["kept"] == ["workers=2", "workers=4"] and summary["lost"][0] == "bf16"
    bf16 = next(link for link in summary["chain"] if link["label"] == "bf16")
    assert bf16["verdict"] == "reject" and not bf16["kept"] and bf16["measured_gain_pct"] < -20
    assert summary["speedup"] == pytest.approx(4.0)
    assert seen_lost[-1][0] == "bf16"  # the diagnosis is told what lost
    assert "--workers 4" in summary["recipe"]["command"] and "check-quality" not in summary["recipe"]["command"]
    assert summary["recipe"]["snippet"].startswith("RunConfig(workload='mlp'")
    assert (tmp_path / "tune" / "report.html").is_file() and (tmp_path / "tune" / "tune_waterfall.png").is_file()


def test_every_candidate_runs_with_the_quality_gate_on(tmp_path):
    configs = []

    class Recording(FakeTrials):
        def __call__(self, cfg, kind, out, time_limit_s=None):
            configs.append((kind, cfg))
            return super().__call__(cfg, kind, out, time_limit_s)

    run_tuner(tmp_path, Recording({("precision", "bf16"): 1.5}), diagnosis_of(("compute bound", 0.9, ["bf16"])),
              quality="strict", max_trials=3)
    candidate = [cfg for kind, cfg in configs if kind == "run"][1]
    assert candidate.check_quality is True and candidate.quality_loss_rtol == 0.005


def test_refused_lever_is_recorded_as_refused_and_not_as_lost(tmp_path):
    trials = FakeTrials({}, statuses={("optimizer_impl", "fused"): REFUSED})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer"])))
    link = summary["chain"][0]
    assert link["label"] == "fused-optimizer"
    assert link["status"] == REFUSED and link["verdict"] == REFUSED and "refused" in link["why"]
    assert "fused-optimizer" not in summary["lost"]


def test_tune_starts_no_trial_that_the_budget_left_cannot_hold(tmp_path):
    trials = FakeTrials({("workers", 2): 2.0}, wall_s=4.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("input pipeline", 0.9, ["workers"])), budget="5s")
    assert len(trials.calls) == 1  # start (4 s); under a second is left: no profile starts
    assert summary["stop_reason"].startswith("budget spent: 4 s of 5 s")
    assert trials.limits[0] == pytest.approx(5.0 - 0.1, abs=0.05)  # every trial is limited to the budget left


def test_batch_search_grows_until_oom_then_bisects(tmp_path):
    trials = FakeTrials({("batch_size", 16): 1.5, ("batch_size", 24): 1.7}, statuses={("batch_size", 32): OOM})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, [])), tune_batch=True)
    batches = [(link["label"], link["status"], link["kept"]) for link in summary["chain"]
               if link["lever"] == search.BATCH_LEVER]
    assert batches == [("batch-size=16", "ok", True), ("batch-size=32", "oom", False), ("batch-size=24", "ok", True),
                       ("batch-size=28", "ok", False)]  # 28 gains nothing over 24: the bisection ends there
    assert summary["best"]["label"] == "batch-size=24"
    assert any("optimisation" in note for note in summary["notes"])


def test_resume_reuses_recorded_trials_and_runs_only_the_rest(tmp_path):
    factors = {("workers", 2): 2.0, ("precision", "bf16"): 0.5}
    diagnosis = diagnosis_of(("input pipeline", 0.55, ["workers", "bf16"]))
    with pytest.raises(KeyboardInterrupt):
        run_tuner(tmp_path, FakeTrials(factors, interrupt_at=3), diagnosis)
    recorded = [json.loads(line)["name"] for line in (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()]
    assert recorded == ["00-start", "01-profile-start", "02-workers-2"]
    assert json.loads((tmp_path / "tune" / "tune.json").read_text())["stop_reason"].startswith("interrupted; best: ")
    again = FakeTrials(factors)
    summary = run_tuner(tmp_path, again, diagnosis, resume=True)
    names = [name for _, name in again.calls]
    assert names[0] == "03-workers-4"  # the trial that was interrupted runs again, and nothing recorded does
    assert not set(names) & set(recorded)
    assert summary["kept"] == ["workers=2"] and summary["trials"] == len(recorded) + len(names)


def test_a_second_tune_into_the_same_directory_needs_resume(tmp_path):
    run_tuner(tmp_path, FakeTrials({}), diagnosis_of(), max_trials=1)
    with pytest.raises(PerflabError, match="--resume"):
        run_tuner(tmp_path, FakeTrials({}), diagnosis_of(), max_trials=1)


# ---------------------------------------------------------------------------------------------- settings

def test_budget_takes_seconds_minutes_and_hours():
    assert [parse_duration(text) for text in ("90s", "20m", "1h", "45")] == [90, 1200, 3600, 45]


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0s"], "--budget must be more than zero"),
    (["--budget", "soon"], "--budget expects a duration"),
    (["--max-p99-ms", "0"], "--max-p99-ms must be a positive number"),
    (["--max-memory-gb", "-1"], "--max-memory-gb must be a positive number"),
    (["--exclude", "warp-drive"], "valid levers: workers"),
])
def test_tune_refuses_bad_constraints_with_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main(["tune", "--workload", "mlp", "--out", str(tmp_path / "t"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "t").exists()


def test_noisy_trials_are_not_judged_and_their_lever_is_not_lost(tmp_path):
    class Busy(FakeTrials):
        def __call__(self, cfg, kind, out, time_limit_s=None):
            outcome = super().__call__(cfg, kind, out)
            outcome.result.metrics.interference = Interference(busy=True, other_cpu_cores_max=1.5)
            return outcome

    diagnosis = diagnosis_of(("input pipeline", 0.9, ["workers"]))
    quiet_only = run_tuner(tmp_path / "a", Busy({("workers", 2): 2.0}), diagnosis)
    link = quiet_only["chain"][0]
    assert not link["kept"] and "busy machine" in link["why"] and quiet_only["lost"] == []
    accepted = run_tuner(tmp_path / "b", Busy({("workers", 2): 2.0}), diagnosis, accept_noisy=True)
    assert accepted["kept"][0] == "workers=2"


def test_a_bottleneck_no_lever_addresses_ends_with_the_diagnosis_advice(tmp_path):
    sync = diagnosis_of(("host-device sync", 0.9, []))
    sync.advice = ["remove .item() inside the step"]
    summary = run_tuner(tmp_path, FakeTrials({}), sync)
    assert summary["chain"] == []
    assert summary["stop_reason"].startswith("no lever left to try for host-device sync; the diagnosis advises: "
                                             "remove .item() inside the step; best: start (kept: nothing)")


class RecordingTrials(FakeTrials):
    """FakeTrials that also keeps the config of every trial it was given."""

    def __init__(self, factors, **kwargs):
        super().__init__(factors, **kwargs)
        self.configs: list[RunConfig] = []

    def __call__(self, cfg: RunConfig, kind: str, out: Path, time_limit_s=None) -> TrialOutcome:
        self.configs.append(cfg)
        return super().__call__(cfg, kind, out, time_limit_s)


@pytest.mark.parametrize("asked, trial_gate", [(None, False), (True, True), (False, False)])
def test_the_start_runs_ungated_unless_check_quality_asks_and_the_recipe_keeps_the_users_setting(tmp_path, asked,
                                                                                                 trial_gate):
    # a start already in bf16 would pay for an fp32 eager run of the whole model before its first lever
    start = START.replace(precision="bf16", check_quality=asked)
    trials = RecordingTrials({("channels_last", True): 1.5})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["channels-last"])), start=start)
    assert trials.configs[0].check_quality is trial_gate
    candidates = [cfg for cfg, (kind, name) in zip(trials.configs, trials.calls) if kind == "run" and name != "00-start"]
    assert candidates and all(cfg.check_quality is True for cfg in candidates)  # what tune changes is gated
    recipe = json.loads((tmp_path / "tune" / "tune.json").read_text())["recipe"]
    assert recipe["config"].get("check_quality") == asked


def test_a_levers_predicted_gain_is_what_it_can_remove_of_its_findings_share():
    # a chain of elementwise ops holding 94.4% of the step: compile may fuse it away (+1686%); bf16 halves its bytes,
    # so at most half of that time goes (+89%), not "+1686%" beside compile's
    diagnosis = diagnosis_of(("memory bandwidth", 0.9, ["compile"], {"expected_gain_pct": 94.4}))
    shares = {p.lever: p.expected_share_pct for p in search.proposals(diagnosis, LEVERS)}
    assert shares["compile"] == pytest.approx(94.4) and shares["bf16"] == pytest.approx(47.2)
    assert search.predicted_gain_pct(shares["bf16"]) == pytest.approx(89.4, abs=0.1)
    assert LEVERS["bf16"].removes("compute bound") == 1.0  # where nothing is declared, all of it

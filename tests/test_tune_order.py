"""perflab tune's order of levers and its budget rules, with fake trials and stubbed diagnoses (no GPU needed)."""
import sys
from pathlib import Path

import pytest

from perflab.tune import candidates as search
from perflab.tune.ordering import arrange
from perflab.config import RunConfig
from perflab.tune.trial import OK, PROFILE_STEPS, TIMEOUT, run_trial
from tests.test_tune import LEVERS, START, FakeTrials, diagnosis_of, run_tuner

CUDA = START.replace(device="cuda", mode="infer")
ONLY_COMPILE = diagnosis_of(("elementwise chains", 0.9, ["compile"]))  # a class no other lever addresses
CONV_NET_LEVERS = ["bf16", "tf32", "fp16", "channels-last", "compile"]  # the compute-bound finding's, fp32 start


def proposals(*levers, source="compute bound"):
    return [search.Proposal(name, source, 0.9, None) for name in levers]


def names(order):
    return [proposal.lever for proposal in order]


class TimedTrials(FakeTrials):
    """Fake trials whose wall time depends on the compile mode (compilation is what costs)."""

    def __init__(self, factors, compile_wall_s):
        super().__init__(factors, wall_s=10.0)
        self.compile_wall_s = compile_wall_s

    def __call__(self, cfg, kind, out, time_limit_s=None):
        self.wall_s = self.compile_wall_s.get(cfg.compile, 10.0)
        return super().__call__(cfg, kind, out, time_limit_s)


def test_channels_last_follows_bf16_before_tf32_and_compile_follows_the_cheap_levers():
    assert names(arrange(proposals(*CONV_NET_LEVERS), CUDA)) == ["bf16", "channels-last", "tf32", "fp16", "compile"]
    memory_bound = proposals("compile", "channels-last", "bf16", "fp16", source="memory bandwidth")
    assert names(arrange(memory_bound, CUDA)) == ["bf16", "channels-last", "fp16", "compile"]
    assert names(arrange(proposals("compile", "channels-last"), CUDA.replace(precision="bf16"))) == [
        "channels-last", "compile"]  # bf16 already kept: the layout it needs comes first
    unsure = proposals("workers", source="input pipeline") + proposals("compile", "channels-last")
    assert names(arrange(unsure, CUDA.replace(precision="bf16"))) == ["workers", "channels-last", "compile"]


def test_compile_stays_ahead_of_levers_another_finding_proposed():
    mixed = proposals("cuda-graphs", "compile", source="launch / framework overhead") + proposals("bf16")
    assert names(arrange(mixed, CUDA)) == ["cuda-graphs", "compile", "bf16"]


def test_device_augmentation_comes_before_the_loader_queue_levers_and_after_workers():
    first = proposals("workers", "persistent-workers", "prefetch-factor", "prefetcher-stream", "augment-gpu",
                      source="input pipeline")
    assert names(arrange(first, START)) == ["workers", "augment-gpu", "persistent-workers", "prefetch-factor",
                                            "prefetcher-stream"]
    later = proposals("prefetch-factor", "persistent-workers", "workers", "prefetcher-stream", "augment-gpu",
                      source="input pipeline")
    assert names(arrange(later, START.replace(workers=8)))[0] == "augment-gpu"


def test_conv_net_tune_tries_channels_last_after_bf16_and_never_measures_tf32_against_bf16(tmp_path):
    trials = FakeTrials({("precision", "bf16"): 2.0, ("channels_last", True): 1.5, ("precision", "tf32"): 0.6})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, CONV_NET_LEVERS)), start=CUDA,
                        exclude=["compile"], max_trials=8)
    labels = [link["label"] for link in summary["chain"]]
    assert labels[:2] == ["bf16", "channels-last"] and summary["kept"] == ["bf16", "channels-last"]
    # channels-last runs straight after bf16 is kept: its partner, before the re-profile
    assert [name for _, name in trials.calls][:4] == ["00-start", "01-profile-start", "02-bf16", "03-channels-last"]
    assert "tf32" not in labels and "fp16" not in labels
    assert "would replace it" in summary["skipped"]["tf32"] and "--precision is already bf16" in summary["skipped"]["tf32"]
    assert summary["speedup"] == 3.0


def test_a_precision_is_tried_only_where_it_reduces_the_arithmetic_further():
    from perflab.tune.ordering import replaces_kept
    assert replaces_kept("precision", "tf32", CUDA.replace(precision="bf16"), CUDA.replace(precision="bf16"))
    assert replaces_kept("precision", "bf16", CUDA.replace(precision="tf32"), CUDA.replace(precision="tf32")) is None
    assert replaces_kept("precision", "bf16", CUDA, CUDA) is None
    assert "(kept)" in replaces_kept("compile", "default", CUDA.replace(compile="max-autotune"), CUDA)


def test_max_autotune_is_skipped_with_its_estimate_when_the_budget_left_is_below_it(tmp_path):
    # plain trials take 10 s; compile=default 40 s, so it added 30 s: max-autotune is estimated at 10 + 15 x 30 s
    trials = TimedTrials({("compile", "default"): 1.5, ("compile", "reduce-overhead"): 1.65},
                         {"default": 40.0, "reduce-overhead": 50.0, "max-autotune": 160.0})
    summary = run_tuner(tmp_path, trials, ONLY_COMPILE, start=CUDA,
                        budget="150s")
    labels = [link["label"] for link in summary["chain"]]
    assert labels == ["compile=default", "compile=reduce-overhead"]  # max-autotune (tried first here) did not fit
    reason = summary["skipped"]["compile=max-autotune"]
    assert "needs about 460 s" in reason and "15x the 30 s" in reason and "87 s of the budget is left" in reason
    assert summary["kept"] == ["compile=default", "compile=reduce-overhead"]
    # every trial carries the budget left as its time limit (less 2% kept for writing tune.json and the report); the
    # profile at most 15% of the budget
    assert trials.limits == pytest.approx([147.0, 22.5, 127.0, 87.0], abs=0.5)
    # 40 s left: less than a profile (10 s) and one trial like the best's (50 s), so no re-profile is spent
    assert summary["stop_reason"] == ("budget nearly spent: 40 s left, less than a profile (10 s) and one trial (50 s) "
                                      "take; best: compile=reduce-overhead (kept: compile=default, "
                                      "compile=reduce-overhead)")


def test_max_autotune_is_tried_before_reduce_overhead_for_a_compute_bound_step_when_it_fits(tmp_path):
    trials = TimedTrials({("compile", "default"): 1.5, ("compile", "max-autotune"): 1.8},
                         {"default": 20.0, "max-autotune": 40.0})
    summary = run_tuner(tmp_path, trials, ONLY_COMPILE, start=CUDA,
                        budget="10m")
    labels = [link["label"] for link in summary["chain"]]
    assert labels == ["compile=default", "compile=max-autotune"]
    assert "already captures CUDA graphs" in summary["skipped"]["compile=reduce-overhead"]


def test_a_lever_inside_the_noise_against_a_large_prediction_is_retried_once_after_the_next_keep(tmp_path):
    finding = ("planted", 0.9, ["bf16", "channels-last"], {"expected_gain_pct": 50.0})  # predicts +100%
    summary = run_tuner(tmp_path, FakeTrials({("channels_last", True): 1.5}), diagnosis_of(finding), start=CUDA)
    labels = [link["label"] for link in summary["chain"]]
    assert labels == ["bf16", "channels-last", "bf16"]  # inside the noise twice: then lost, not tried a third time
    assert summary["lost"] == ["bf16"] and any("tried once more" in note for note in summary["notes"])
    modest = ("planted", 0.9, ["bf16", "channels-last"], {"expected_gain_pct": 5.0})
    once = run_tuner(tmp_path / "modest", FakeTrials({("channels_last", True): 1.5}), diagnosis_of(modest), start=CUDA)
    assert [link["label"] for link in once["chain"]] == ["bf16", "channels-last"]


def test_the_profile_trial_runs_only_the_profilers_schedule(tmp_path):
    seen = []

    class Recording(FakeTrials):
        def __call__(self, cfg, kind, out, time_limit_s=None):
            seen.append((kind, cfg.steps, cfg.trials, cfg.min_trial_s))
            return super().__call__(cfg, kind, out, time_limit_s)

    run_tuner(tmp_path, Recording({}), diagnosis_of(("planted", 0.9, [])), start=START.replace(steps=30))
    assert seen == [("run", 30, 3, START.min_trial_s), ("profile", PROFILE_STEPS, 1, 0.0)]


def test_a_trial_past_its_time_limit_is_killed_and_recorded_as_a_timeout(tmp_path):
    began = __import__("time").perf_counter()
    outcome = run_trial(START.replace(steps=100000), "run", tmp_path / "slow", time_limit_s=0.5)
    assert outcome.status == TIMEOUT and "stopped after 0 s" in outcome.reason and outcome.result is None
    assert __import__("time").perf_counter() - began < 30
    assert Path(str(tmp_path / "slow") + ".log").read_text().startswith("$ " + sys.executable)


def test_a_trial_stopped_at_its_limit_after_saving_a_whole_result_keeps_its_measurement(tmp_path):
    # the run measures and saves its result in a few seconds, then takes 10 minutes to exit
    cfg = RunConfig(workload=str(Path(__file__).parent / "fixtures/sleepy_plugin.py") + ":build", mode="train",
                    workload_options={"exit_sleep_s": "600"}, steps=2, trials=1, warmup=1, device="cpu",
                    batch_size=8)
    began = __import__("time").perf_counter()
    outcome = run_trial(cfg, "run", tmp_path / "slow-exit", time_limit_s=12)
    assert outcome.status == OK and outcome.result is not None and outcome.result.trials, outcome.reason
    assert 12 <= __import__("time").perf_counter() - began < 30 and outcome.wall_s >= 12


def test_the_workers_search_reaches_the_cpus_this_process_may_use_capped_by_a_cgroup_quota(tmp_path):
    from perflab.tune.candidates import usable_cpus
    affinity = usable_cpus(tmp_path / "absent")
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    assert usable_cpus(quota) == 1
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == affinity
    assert search.ladder_rungs(LEVERS["workers"], 0, 16)[-1] == 16

"""tune's two stages with fake trials: every candidate screened by one short trial, only screened wins confirmed."""
import json

import pytest

from perflab.tune import screen_order, screening
from perflab.tune.rows import TrialRow
from perflab.tune.screening import SCREEN, screen_config, win_threshold_pct
from perflab.tune.trial import OK, TrialOutcome
from test_tune import START, FakeTrials, diagnosis_of, fake_result, run_tuner


class Timed(FakeTrials):
    """Fake trials whose wall time grows with their trials (a screen is one short trial, a confirmation three plus
    the gate) and with compiling; records every config it ran."""

    def __init__(self, factors, screen_s=2.0, full_s=6.0, compile_s=0.0, **kwargs):
        super().__init__(factors, **kwargs)
        self.screen_s, self.full_s, self.compile_s = screen_s, full_s, compile_s
        self.configs = []

    def __call__(self, cfg, kind, out, time_limit_s=None):
        self.configs.append((kind, out.name, cfg))
        self.wall_s = (self.screen_s if cfg.trials == 1 else self.full_s) + (self.compile_s if cfg.compile else 0)
        if time_limit_s is not None and self.wall_s > time_limit_s:
            self.calls.append((kind, out.name))
            return TrialOutcome("timeout", time_limit_s, reason="planted: over its limit")
        return super().__call__(cfg, kind, out, time_limit_s)


def screened(summary, label):
    return next(entry for entry in summary["screened"] if entry["label"] == label)


def test_every_candidate_is_screened_once_and_only_a_screened_win_gets_the_full_trials_and_the_gate(tmp_path):
    # the diagnosis names bf16 (which loses); compile, which it never names, wins 3x: screened as insurance
    trials = Timed({("compile", "default"): 3.0, ("precision", "bf16"): 0.8})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["bf16"])), screening=True)
    names = [name for _, name, _ in trials.configs]
    assert names[:4] == ["00-start", "01-profile-start", "02-screen-start", "03-screen-bf16"]  # named lever first
    screens = [cfg for kind, name, cfg in trials.configs if "-screen-" in name]
    assert screens and all(cfg.trials == 1 and cfg.check_quality is False and cfg.min_trial_s <= 1.0
                           for cfg in screens)
    full = [(name, cfg) for kind, name, cfg in trials.configs if kind == "run" and "-screen-" not in name]
    assert [name for name, _ in full][1:2] == ["%02d-compile-default" % names.index(full[1][0])]
    assert full[1][1].check_quality is True and full[1][1].trials == 3  # confirmed in full, with the quality gate
    assert summary["kept"][0] == "compile=default" and "bf16" in summary["lost"]
    assert screened(summary, "compile=default")["outcome"] == "confirmed: kept"
    assert screened(summary, "bf16")["outcome"].startswith("no win")
    confirm = next(link for link in summary["chain"] if link["label"] == "compile=default")
    assert confirm["stage"] == "confirm" and confirm["screened_gain_pct"] == pytest.approx(200.0)
    assert {link["stage"] for link in summary["chain"]} == {"confirm"}  # screens are not decisions
    assert summary["speedup"] == pytest.approx(3.0)


def test_the_big_one_flag_levers_are_screened_when_the_diagnosis_is_silent_about_them():
    from perflab.levers import all_levers
    from perflab.tune import candidates as search
    levers = {lever.name: lever for lever in all_levers()}
    silent = diagnosis_of(("host-device sync", 0.9, []))
    order = [p.lever for p in screen_order.screening_order(search.proposals(silent, levers), levers, START)]
    assert set(order[:5]) == {"compile", "cuda-graphs", "bf16", "channels-last", "workers"}  # first, unnamed
    assert order.index("channels-last") == order.index("bf16") + 1  # layout follows precision
    launch = diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer", "compile", "cuda-graphs"]))
    order = [p.lever for p in screen_order.screening_order(search.proposals(launch, levers), levers, START)]
    assert set(order[:2]) == {"compile", "cuda-graphs"} and order.index("fused-optimizer") > order.index("workers")


def test_when_nothing_the_diagnosis_proposed_wins_every_other_lever_is_screened_and_a_win_kept(tmp_path):
    # the planted nonzero router on an H200: the sync diagnosis's levers and the big ones lost, tune stopped with
    # "no lever won" after 76 s of 180, and the fused optimizer (never proposed) gave 1.38x
    trials = Timed({("optimizer_impl", "fused"): 1.38})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="10m", screening=True)
    entry = screened(summary, "fused-optimizer")
    assert entry["outcome"] == "confirmed: kept" and summary["kept"] == ["fused-optimizer"]
    assert summary["speedup"] == pytest.approx(1.38)
    sync_levers = [s["label"] for s in summary["screened"]]
    assert sync_levers.index("fused-optimizer") > sync_levers.index("compile=default")  # after the proposed ones


def test_a_finding_that_explains_a_large_share_has_its_levers_screened_before_the_unnamed_big_ones():
    # 2 GPUs, 19 s a trial: the all-reduce levers came after bf16, compile and CUDA graphs and were never reached
    from perflab.levers import all_levers
    from perflab.tune import candidates as search
    levers = {lever.name: lever for lever in all_levers()}
    comm = ["ddp-bucket-size", "bf16-comm-hook", "grad-accum"]
    start = START.replace(nproc=2)
    large = diagnosis_of(("collectives", 0.8, comm, {"expected_gain_pct": 37.0}))
    order = [p.lever for p in screen_order.screening_order(search.proposals(large, levers), levers, start)]
    assert order[:3] == comm and order.index("grad-accum") < order.index("compile")
    small = diagnosis_of(("collectives", 0.8, comm, {"expected_gain_pct": 5.0}))
    order = [p.lever for p in screen_order.screening_order(search.proposals(small, levers), levers, start)]
    assert order.index("compile") < order.index("ddp-bucket-size")  # a small finding: the big levers first


def test_a_screened_win_the_budget_cannot_confirm_is_in_the_recipe_with_its_command_and_not_kept(tmp_path):
    # start 30 s (full trials) + profile + screens of 2 s: not even two short trials (about 23 s) fit a 55-s budget
    trials = Timed({("compile", "default"): 3.0}, screen_s=2.0, full_s=30.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["bf16"])), budget="55s",
                        screening=True, report=True)
    entry = screened(summary, "compile=default")
    assert entry["win"] and entry["outcome"].startswith("not confirmed: budget")
    assert summary["kept"] == [] and summary["best"]["label"] == "start" and summary["chain"] == []
    assert "compile=default screened +200%, not confirmed: budget" in summary["stop_reason"]
    assert summary["unconfirmed"] and summary["spent_s"] <= 55 * 1.05
    win = summary["recipe"]["unconfirmed"][0]
    assert win["line"] == "compile=default: screened, not confirmed: +200% (screen)"
    assert win["command"].startswith("perflab run --workload mlp") and "--compile default" in win["command"]
    assert "--check-quality" in win["command"]  # the confirmation's own run: full trials with the quality gate
    recipe_txt = (tmp_path / "tune" / "recipe.txt").read_text()
    assert win["line"] in recipe_txt and win["command"] in recipe_txt
    assert win["line"] in (tmp_path / "tune" / "report.md").read_text()


def test_a_win_rejected_at_confirmation_is_not_kept_and_says_why(tmp_path):
    class FailsQuality(Timed):
        def __call__(self, cfg, kind, out, time_limit_s=None):
            outcome = super().__call__(cfg, kind, out, time_limit_s)
            if cfg.check_quality and cfg.precision == "bf16":
                result = fake_result(cfg, 300.0, quality="fail")
                result.save(out)
                return TrialOutcome("quality-fail", outcome.wall_s, "planted", result)
            return outcome

    trials = FailsQuality({("precision", "bf16"): 3.0})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["bf16"])), screening=True,
                        exclude=["compile"])
    assert screened(summary, "bf16")["outcome"].startswith("not confirmed: ")
    assert "bf16" not in summary["kept"] and summary["best"]["label"] == "start"


@pytest.mark.parametrize("factors", [
    {},  # nothing wins
    {("optimizer_impl", "fused"): 1.5},  # the fused optimizer wins, then nothing more
    {("compile", "default"): 3.0, ("precision", "bf16"): 1.5, ("workers", 2): 1.2},
])
def test_the_stop_reason_the_best_and_the_kept_levers_always_agree(tmp_path, factors):
    diagnosis = diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer", "compile"]))
    summary = run_tuner(tmp_path, Timed(factors), diagnosis, screening=True)
    best, kept, reason = summary["best"], summary["kept"], summary["stop_reason"]
    assert f"best: {best['label']} (kept: {', '.join(kept) if kept else 'nothing'})" in reason
    if kept:
        assert best["label"] == kept[-1] and "no lever won" not in reason
        assert summary["speedup"] > 1
    else:
        assert best["label"] == "start"
    on_disk = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert on_disk["stop_reason"] == reason and on_disk["best"] == best
    assert (tmp_path / "tune" / "recipe.txt").read_text().startswith(summary["recipe"]["command"])


def test_screens_are_judged_against_a_short_trial_of_the_best_not_against_its_full_trials():
    cfg = START.replace(min_trial_s=3.0, check_quality=True)
    assert screen_config(cfg).trials == 1 and screen_config(cfg).min_trial_s == 1.0
    assert screen_config(cfg).check_quality is False
    assert win_threshold_pct(2.0) == 5.0 and win_threshold_pct(4.0) == 8.0


def test_every_trial_gets_the_budget_left_as_its_time_limit_and_a_slow_one_is_stopped(tmp_path):
    trials = Timed({("compile", "default"): 3.0}, compile_s=500.0)  # compiling would take 500 s
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["compile"])), budget="60s",
                        screening=True)
    assert all(limit is not None for limit in trials.limits)
    assert summary["spent_s"] <= 60 * 1.05
    assert screened(summary, "compile=default")["status"] == "timeout"
    assert summary["stop_reason"].startswith("budget spent")
    rows = [json.loads(line) for line in (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()]
    assert any(row.get("stage") == SCREEN and row["status"] == "timeout" for row in rows)
    assert OK in {row["status"] for row in rows}


def test_screening_leaves_room_in_the_budget_to_confirm_the_best_win_so_far(tmp_path):
    # screens of 2 s, full trials of 20 s: once workers=2 screens as a win, screening stops while 20 s are needed
    trials = Timed({("workers", 2): 2.0}, screen_s=2.0, full_s=20.0)
    diagnosis = diagnosis_of(("no clear bottleneck", 0.5, []))  # every lever is a candidate: more screens than fit
    summary = run_tuner(tmp_path, trials, diagnosis, budget="75s", screening=True)
    assert summary["kept"] == ["workers=2"], summary["screened"]
    assert any("after the confirmation" in why for why in summary["skipped"].values())
    assert summary["spent_s"] <= 75 * 1.05


def test_a_resumed_tune_reuses_every_recorded_screen_and_ends_where_an_uninterrupted_one_does(tmp_path):
    factors = {("compile", "default"): 3.0, ("workers", 2): 1.5}
    diagnosis = diagnosis_of(("input pipeline", 0.9, ["workers"]))
    whole = run_tuner(tmp_path / "whole", Timed(factors), diagnosis, screening=True)
    with pytest.raises(KeyboardInterrupt):
        run_tuner(tmp_path, Timed(factors, interrupt_at=5), diagnosis, screening=True)
    recorded = (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()
    assert len(recorded) == 5 and json.loads((tmp_path / "tune" / "tune.json").read_text())["best"]
    again = Timed(factors)
    resumed = run_tuner(tmp_path, again, diagnosis, screening=True, resume=True)
    assert again.calls[0][1].startswith("05-")  # the five recorded trials were reused, not run again
    lines = (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["key"] for line in lines})  # no trial ran twice
    assert resumed["kept"] == whole["kept"] and resumed["best"]["label"] == whole["best"]["label"]
    assert [s["label"] for s in resumed["screened"]] == [s["label"] for s in whole["screened"]]


def test_start_noise_is_the_wider_of_its_confidence_interval_and_a_reference_repeat():
    # the planted nonzero router on an H200 (2026-11-26): start 5,145 (95% CI 4,842-5,722), reference 5,560
    start = TrialRow(throughput=5145.1, throughput_ci95=[4841.7, 5722.0])
    assert screening.start_noise_pct(start, [TrialRow(throughput=5560.2)]) == pytest.approx(8.55, abs=0.01)
    assert screening.start_noise_pct(start, [TrialRow(throughput=6000.0)]) == pytest.approx(16.6, abs=0.1)
    assert screening.start_noise_pct(TrialRow(throughput=100.0, throughput_ci95=[None, None]), []) is None
    assert screening.start_noise_pct(TrialRow(throughput=None), [TrialRow(throughput=5.0)]) is None


class NoisyStart(Timed):
    """The start's own trials spread +-9% (its 95% CI), as the planted nonzero router's did on an H200."""

    def __call__(self, cfg, kind, out, time_limit_s=None):
        outcome = super().__call__(cfg, kind, out, time_limit_s)
        if out.name == "00-start" and outcome.result is not None:
            throughput = outcome.result.metrics.throughput_samples_per_s
            throughput.ci95_low, throughput.ci95_high = 91.0, 109.0
        return outcome


@pytest.mark.parametrize("trials, verdict", [
    (NoisyStart({("optimizer_impl", "fused"): 1.03}), "inconclusive: no lever won"),
    (Timed({("optimizer_impl", "fused"): 1.03}), "no lever won"),
])
def test_no_lever_won_is_a_verdict_only_when_the_start_holds_stiller_than_a_screens_threshold(tmp_path, trials,
                                                                                               verdict):
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="10m", screening=True)
    assert summary["kept"] == [] and summary["stop_reason"].startswith(verdict)
    if verdict.startswith("inconclusive"):
        assert "moves 9% from one measurement to the next, more than the +5%" in summary["stop_reason"]


class ShortTrialsJitter(Timed):
    """Short screens jitter: the reference of the best reads 15% high at a screen's usual length, so a real +8% lever
    screens as a loss; trials three times as long read true (the planted nonzero router's start moved 28-41%)."""

    def throughput(self, cfg):
        value = super().throughput(cfg)
        short = cfg.trials == 1 and cfg.steps == START.steps
        return value * 1.15 if short and cfg.optimizer_impl == START.optimizer_impl else value


def test_no_win_over_a_start_that_moves_more_than_a_screen_shows_is_screened_again_with_longer_trials(tmp_path):
    trials = ShortTrialsJitter({("optimizer_impl", "fused"): 1.08})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer"])),
                        budget="10m", screening=True)
    fused = [entry for entry in summary["screened"] if entry["label"] == "fused-optimizer"]
    assert [entry["win"] for entry in fused] == [False, True]  # lost at the short length, won at 3x
    longer = [cfg for _, name, cfg in trials.configs if name.endswith("screen-fused-optimizer")][-1]
    assert longer.steps == 3 * START.steps and longer.trials == 1
    assert summary["kept"] == ["fused-optimizer"], summary["stop_reason"]
    assert any("screened again with trials 3x as long" in note for note in summary["notes"])


def test_the_steadier_pass_runs_once_and_leaves_a_loss_at_full_trials_lost(tmp_path):
    # the start's own trials spread +-9%: every lever loses, at both lengths; the stop stays inconclusive and the
    # levers were screened exactly twice
    trials = NoisyStart({("optimizer_impl", "fused"): 1.03})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="10m", screening=True)
    labels = [entry["label"] for entry in summary["screened"]]
    assert summary["stop_reason"].startswith("inconclusive: no lever won")
    assert labels and all(labels.count(label) == 2 for label in set(labels)), labels
    assert {cfg.steps for _, name, cfg in trials.configs if "-screen-" in name} == {START.steps, 3 * START.steps}


def test_no_steadier_pass_where_the_budget_left_cannot_hold_a_longer_reference_and_screen(tmp_path):
    # the first pass takes 40 s of screens of 2 s; 8 s are left, less than 2 x 3 x 2 s: the stop stays inconclusive
    # with the short screens' noise, and no screen runs twice
    trials = NoisyStart({("optimizer_impl", "fused"): 1.03})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="48s", screening=True)
    labels = [entry["label"] for entry in summary["screened"]]
    assert summary["stop_reason"].startswith("inconclusive: no lever won"), summary["stop_reason"]
    assert len(labels) == len(set(labels)) and not any("screened again" in note for note in summary["notes"])


def test_a_tune_interrupted_in_its_steadier_pass_resumes_it_without_running_a_trial_twice(tmp_path):
    factors = {("optimizer_impl", "fused"): 1.08}
    diagnosis = diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer"]))
    whole = run_tuner(tmp_path / "whole", ShortTrialsJitter(factors), diagnosis, budget="10m", screening=True)
    # interrupted just after the first longer screen of the uninterrupted tune
    rows = [json.loads(line) for line in (tmp_path / "whole" / "tune" / "tune.jsonl").read_text().splitlines()]
    cut_at = next(index for index, row in enumerate(rows) if row["config"]["steps"] == 3 * START.steps) + 1
    with pytest.raises(KeyboardInterrupt):
        run_tuner(tmp_path, ShortTrialsJitter(factors, interrupt_at=cut_at), diagnosis, budget="10m", screening=True)
    resumed = run_tuner(tmp_path, ShortTrialsJitter(factors), diagnosis, budget="10m", screening=True, resume=True)
    lines = (tmp_path / "tune" / "tune.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["key"] for line in lines})  # no trial ran twice
    assert resumed["kept"] == whole["kept"] == ["fused-optimizer"]
    assert [s["label"] for s in resumed["screened"]] == [s["label"] for s in whole["screened"]]


class StartsTheWorker(Timed):
    """The start's trial also starts the warm worker: 10 s more of wall time, recorded as its setup_s."""

    def __call__(self, cfg, kind, out, time_limit_s=None):
        outcome = super().__call__(cfg, kind, out, time_limit_s)
        if out.name == "00-start":
            outcome.wall_s += 10.0
            outcome.setup_s = 10.0
        return outcome


def test_the_worker_start_the_start_paid_is_not_counted_as_a_confirmations_quality_gate(tmp_path):
    # full trials of 6 s, a start of 16 s of which 10 s started the worker: the gate is estimated from the 6, so the
    # win is confirmed in full where a 10-s larger "gate" would have had it sized down to fewer, shorter trials
    trials = StartsTheWorker({("optimizer_impl", "fused"): 1.5})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("launch / framework overhead", 0.9, ["fused-optimizer"])),
                        budget="36s", screening=True, exclude=["bf16", "channels-last", "compile", "cuda-graphs",
                                                              "workers"])
    assert summary["kept"] == ["fused-optimizer"]
    assert screened(summary, "fused-optimizer")["outcome"] == "confirmed: kept"
    start = json.loads((tmp_path / "tune" / "tune.jsonl").read_text().splitlines()[0])
    assert start["setup_s"] == 10.0 and start["wall_s"] == 16.0


def test_a_lever_whose_values_are_all_refused_for_one_reason_is_said_once_and_each_recorded():
    from perflab.tune.candidate_trials import refuse
    skipped, notes = {}, []
    observer = type("Observer", (), {"note": lambda self, line: notes.append(line)})()
    staged = "--workers tunes the DataLoader, but this workload runs on batches pre-staged on the device"
    for value in (2, 4, 8):
        refuse(skipped, observer, f"workers={value}", "workers", staged)
    refuse(skipped, observer, "workers=8", "workers", staged)
    refuse(skipped, observer, "workers-x", "workers-x", staged)  # another lever: said again
    refuse(skipped, observer, "compile=max-autotune", "compile", "needs 300 s")
    refuse(skipped, observer, "compile=reduce-overhead", "compile", "needs 60 s")  # another reason: said
    assert notes == [f"not trying workers=2: {staged}", f"not trying workers-x: {staged}",
                     "not trying compile=max-autotune: needs 300 s", "not trying compile=reduce-overhead: needs 60 s"]
    assert set(skipped) >= {"workers=2", "workers=4", "workers=8"}


def test_a_win_too_costly_to_confirm_holds_no_budget_back_from_a_cheaper_lever_that_fits(tmp_path):
    # compile screens as the big win, but its confirmation (full trials plus compiling, 40 s) no longer fits;
    # the budget left still holds a plain screen and a plain confirmation, so the fused optimizer is screened and kept
    trials = Timed({("compile", "default"): 3.0, ("optimizer_impl", "fused"): 1.5}, screen_s=2.0, full_s=10.0,
                   compile_s=30.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("launch / framework overhead", 0.9, ["compile"])),
                        budget="80s", screening=True)
    assert screened(summary, "compile=default")["outcome"].startswith("not confirmed: budget")
    assert summary["kept"] == ["fused-optimizer"], (summary["screened"], summary["skipped"])
    assert " -" not in summary["stop_reason"].split("left")[0]  # no negative time left is ever reported
    assert summary["spent_s"] <= 80 * 1.05


def test_a_slow_screen_is_stopped_before_it_eats_the_time_held_to_confirm_a_win(tmp_path):
    # bf16 screens as a win; compile=default's first screen (its compile time unknown, so it runs until its limit)
    # compiles for 100 s: it is stopped where bf16's 10-s confirmation would no longer fit, and bf16 is kept
    trials = Timed({("precision", "bf16"): 2.0, ("compile", "default"): 3.0}, screen_s=2.0, full_s=10.0,
                   compile_s=100.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("compute bound", 0.9, ["bf16"])), budget="60s",
                        screening=True)
    assert screened(summary, "compile=default")["status"] == "timeout"
    assert summary["kept"] == ["bf16"], summary["screened"]
    assert summary["spent_s"] <= 60 * 1.05


def test_a_win_larger_than_any_candidate_left_could_give_is_confirmed_before_the_smaller_ones_are_screened(tmp_path):
    # a chain of 360 elementwise ops on an H200: compile screened +787%, then fp16 was screened and 2 s were left for
    # a confirmation that needed 31 s. The finding predicts +25% for the fused optimizer; the unnamed levers count as
    # +100%: compile's +200% is larger than all of them, so it is confirmed at once
    trials = Timed({("compile", "default"): 3.0, ("optimizer_impl", "fused"): 1.2})
    launch = diagnosis_of(("launch / framework overhead", 0.9, ["compile", "fused-optimizer"],
                           {"expected_gain_pct": 20.0}))
    summary = run_tuner(tmp_path, trials, launch, screening=True)
    names = [name for _, name, _ in trials.configs]
    confirm = names.index(next(name for name in names if name.endswith("-compile-default") and "screen" not in name))
    assert names[confirm - 1].endswith("-screen-compile-default")  # confirmed straight after its screen
    fused_screen = names.index(next(name for name in names if name.endswith("-screen-fused-optimizer")))
    assert confirm < fused_screen
    assert summary["kept"][0] == "compile=default"


def test_a_win_smaller_than_a_candidate_left_waits_for_the_rounds_screens():
    from perflab.tune.screen_order import expected_gain_pct
    from perflab.tune import candidates as search
    predicted = search.Proposal("fused-optimizer", "launch / framework overhead", 0.9, 20.0)
    assert expected_gain_pct(predicted) == pytest.approx(25.0)  # 1 / (1 - 0.2) - 1
    unpredicted = search.Proposal("compile", screen_order.INSURANCE_SOURCE, None, None, named=False)
    assert expected_gain_pct(unpredicted) == screen_order.UNPREDICTED_GAIN_PCT


class TrialsScaled(FakeTrials):
    """Fake trials that last what they run: 2 s to start, each trial max(--min-trial-s, 0.3 s), 4 s of quality
    gate; records every config."""

    def __init__(self, factors, **kwargs):
        super().__init__(factors, **kwargs)
        self.configs = []

    def __call__(self, cfg, kind, out, time_limit_s=None):
        self.configs.append((kind, out.name, cfg))
        self.wall_s = 2.0 + cfg.trials * max(cfg.min_trial_s, 0.3) + (4.0 if cfg.check_quality else 0.0)
        if time_limit_s is not None and self.wall_s > time_limit_s:
            self.calls.append((kind, out.name))
            return TrialOutcome("timeout", time_limit_s, reason="planted: over its limit")
        return super().__call__(cfg, kind, out, time_limit_s)


def test_a_confirmation_sized_to_a_short_remaining_time_runs_fewer_shorter_trials_instead_of_none(tmp_path):
    # start 15 s, profile 2 s, reference and compile's screen 3 s each: 11 s are left of 35, a full confirmation
    # (3 trials of 3 s and the gate) needs 15 s; 3 trials of 1 s (9 s) fit
    trials = TrialsScaled({("compile", "default"): 3.0})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("elementwise chains", 0.9, ["compile"])),
                        start=START.replace(check_quality=True), budget="35s", screening=True)
    confirm = next(cfg for kind, name, cfg in trials.configs if name.endswith("-compile-default")
                   and "screen" not in name)
    assert (confirm.trials, confirm.min_trial_s) == (3, 1.0) and confirm.check_quality
    link = next(link for link in summary["chain"] if link["label"] == "compile=default")
    assert link["confirmation"]["full"] is False and link["confirmation"]["trials"] == 3
    assert link["kept"] and link["ci95_pct"][0] is not None  # judged, with the interval its trials give
    assert screened(summary, "compile=default")["outcome"].startswith("confirmed: kept (3 trials of at least 1 s")
    assert summary["kept"] == ["compile=default"] and summary["spent_s"] <= 35 * 1.05


class CutProfile(Timed):
    """Every profile runs past its time limit (6,900 kernels a step): stopped, no trace."""

    def __call__(self, cfg, kind, out, time_limit_s=None):
        if kind == "profile":
            self.configs.append((kind, out.name, cfg))
            self.calls.append((kind, out.name))
            self.limits.append(time_limit_s)
            return TrialOutcome("timeout", time_limit_s, reason="planted: stopped at its limit")
        return super().__call__(cfg, kind, out, time_limit_s)


def test_a_profile_cut_at_its_limit_leads_to_screening_the_insurance_levers_not_to_an_empty_result(tmp_path):
    # 600 small tensors updated by Adam(foreach=False): the start's profile ran 65 s of a 90-s budget and was cut
    trials = CutProfile({("compile", "default"): 3.0})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="90s",
                        screening=True)
    assert trials.limits[1] == pytest.approx(0.15 * 90)  # the start's profile: at most 15% of the budget
    first_round = [entry["label"] for entry in summary["screened"]][:3]
    assert all(label.split("=")[0] in screen_order.INSURANCE for label in first_round), first_round
    assert summary["kept"] == ["compile=default"] and summary["best"]["label"] == "compile=default"
    assert summary["diagnoses"][0]["cut"] and "cut at its limit (14 s, 15% of the budget)" in summary["profile_cut"]
    assert any("was cut" in note for note in summary["notes"])
    assert "cut at its limit" in summary["stop_reason"] and summary["spent_s"] <= 90 * 1.05
    profiles = [cfg for kind, name, cfg in trials.configs if kind == "profile"]
    if len(profiles) > 1:  # after a cut, the next profile records one active step
        assert profiles[1].steps == 3


class CachedCompile(Timed):
    """The first trial of a compiled configuration compiles for `compile_s` (and says so in its metrics); later
    trials of it find the graph in the caches and compile for 0.5 s, as tune's shared Inductor caches make them."""

    def __init__(self, factors, **kwargs):
        super().__init__(factors, **kwargs)
        self.compiled = set()

    def __call__(self, cfg, kind, out, time_limit_s=None):
        first = cfg.compile and cfg.compile not in self.compiled
        compile_s = (self.compile_s if first else 0.5) if cfg.compile else None
        self.configs.append((kind, out.name, cfg))
        self.wall_s = (self.screen_s if cfg.trials == 1 else self.full_s) + (compile_s or 0.0)
        if time_limit_s is not None and self.wall_s > time_limit_s:
            self.calls.append((kind, out.name))
            return TrialOutcome("timeout", time_limit_s, reason="planted: over its limit")
        if cfg.compile:
            self.compiled.add(cfg.compile)
        outcome = FakeTrials.__call__(self, cfg, kind, out, time_limit_s)
        if outcome.result is not None and compile_s is not None:
            outcome.result.metrics.compile_s = compile_s
        return outcome


def test_a_compiled_win_is_confirmed_in_the_time_its_cached_compile_takes_not_its_first_compile(tmp_path):
    # hand-written attention on 2 CPU cores: compile's screen spent 19 s compiling, its confirmation 0.3 s; tune
    # counted the screen's compile again ("needs about 33 s, 11 s left") and kept nothing. Here: start 6 s,
    # profile and reference 2 s each, compile's screen 2 + 20 s; 13 s are left of 45, a confirmation takes 6.5 s
    trials = CachedCompile({("compile", "default"): 3.0}, screen_s=2.0, full_s=6.0, compile_s=20.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("memory bandwidth", 0.9, ["compile"])),
                        start=START.replace(check_quality=True), budget="45s", screening=True)
    entry = screened(summary, "compile=default")
    assert entry["win"] and entry["outcome"].startswith("confirmed: kept"), entry["outcome"]
    assert summary["kept"] == ["compile=default"] and summary["spent_s"] <= 45 * 1.05


def test_a_confirmation_does_not_count_the_screens_compile_again_beyond_a_compile_through_the_caches():
    from perflab.tune.confirmation import ConfirmationCost, cached_compile_saving_s
    assert cached_compile_saving_s(None) == 0.0 and cached_compile_saving_s(0.4) == 0.0
    assert cached_compile_saving_s(20.0) == pytest.approx(17.0)  # 15% of it stays: 3 s
    assert cached_compile_saving_s(4.0) == pytest.approx(3.0)  # at least 1 s stays
    plain = ConfirmationCost(22.0, 1.0, 0.1, 3.0, 3, 1.0)
    cached = ConfirmationCost(22.0, 1.0, 0.1, 3.0, 3, 1.0, cached_compile_saving_s(20.0))
    assert plain.expected_s(3, 1.0) - cached.expected_s(3, 1.0) == pytest.approx(17.0)


class CutProfileOptimizerHeavy(CutProfile):
    """Every profile is cut, and every run's own phase timing puts 55% of the step in the optimizer (600 small
    tensors updated one at a time); the foreach and fused implementations win 2x."""

    def __call__(self, cfg, kind, out, time_limit_s=None):
        outcome = super().__call__(cfg, kind, out, time_limit_s)
        if outcome.result is not None:
            share = 55.0 if cfg.optimizer_impl == "default" else 10.0
            outcome.result.metrics.phase_share_pct = {"forward": 20.0, "backward": 100 - 20.0 - share,
                                                      "optimizer": share}
            outcome.result.save(out)
        return outcome


def test_a_cut_profile_screens_first_the_levers_the_best_runs_phase_timing_names(tmp_path):
    trials = CutProfileOptimizerHeavy({("optimizer_impl", "fused"): 2.0, ("optimizer_impl", "foreach"): 1.8})
    summary = run_tuner(tmp_path, trials, diagnosis_of(("host-device sync", 0.9, [])), budget="90s",
                        screening=True)
    labels = [entry["label"] for entry in summary["screened"]]
    assert labels[0] == "fused-optimizer", labels  # before the insurance levers
    assert summary["kept"][0] == "fused-optimizer"
    assert any("the optimizer step takes 55% of the step" in note for note in summary["notes"])  # the start's cut
    assert summary["spent_s"] <= 90 * 1.05


class UnsteadyAtFirst(Timed):
    """CUDA graphs win 1.3x; their trials disagree by 88% at the start's length and agree when twice as long (a
    loader-fed step, pinned: its bursts average out over longer trials)."""

    def __call__(self, cfg, kind, out, time_limit_s=None):
        outcome = super().__call__(cfg, kind, out, time_limit_s)
        if outcome.result is not None and cfg.cuda_graphs and cfg.trials > 1 and cfg.steps <= START.steps:
            outcome.result.metrics.steady = False
            outcome.result.metrics.throughput_samples_per_s.range_pct = 88.0
            outcome.result.save(out)
        return outcome


def test_a_confirmation_unjudged_for_its_candidates_own_noise_runs_once_more_with_longer_trials(tmp_path):
    trials = UnsteadyAtFirst({("cuda_graphs", True): 1.3})
    start = START.replace(device="cuda")
    summary = run_tuner(tmp_path, trials, diagnosis_of(("launch / framework overhead", 0.9, ["cuda-graphs"])),
                        start=start, budget="10m", screening=True)
    confirmations = [cfg for kind, name, cfg in trials.configs if name.endswith("-cuda-graphs") and cfg.trials > 1]
    assert [cfg.steps for cfg in confirmations] == [START.steps, 2 * START.steps]
    assert summary["kept"] == ["cuda-graphs"], screened(summary, "cuda-graphs")["outcome"]
    assert "again with trials 2x as long" in screened(summary, "cuda-graphs")["outcome"]
    assert f"--steps {START.steps} " in summary["recipe"]["command"]  # the recipe keeps the user's trial length


def test_a_confirmation_unjudged_because_the_best_itself_is_unsteady_is_not_repeated(tmp_path):
    # judged through compare itself: whose timings were unclean is compare's typed noisy_sides, not its wording
    from perflab.tune.confirmation import candidate_alone_unsteady
    from perflab.tune.decision import judge
    from perflab import RunConfig, run
    from test_compare import unsteady, with_throughputs
    measured = run("mlp", RunConfig(workload="mlp", device="cpu", steps=3, trials=3, warmup=1, batch_size=32))
    measured.metrics.interference.busy, measured.metrics.steady = False, True
    best, faster = with_throughputs(measured, [1000.0, 1010.0, 990.0]), with_throughputs(measured, [1150.0] * 3)
    both_unsteady = judge(unsteady(best, 30.0), unsteady(faster, 30.0), 2.0)
    candidate_only = judge(best, unsteady(faster, 30.0), 2.0)
    assert not both_unsteady.judged and not candidate_alone_unsteady(both_unsteady)
    assert not candidate_only.judged and candidate_alone_unsteady(candidate_only), candidate_only.noisy
    assert not candidate_alone_unsteady(judge(best, with_throughputs(measured, [800.0] * 3), 2.0))  # judged


def test_a_screen_on_a_compiled_best_is_expected_to_cost_a_cached_compile_not_the_first_one(tmp_path):
    # the round after compile is kept reads its reference from compile's own screen (the same configuration, reused
    # from tune.jsonl with its 20-s first compile); a screen on top of it costs 2.5 s, not 22: 14 s are left for them
    trials = CachedCompile({("compile", "default"): 3.0}, screen_s=2.0, full_s=6.0, compile_s=20.0)
    summary = run_tuner(tmp_path, trials, diagnosis_of(("memory bandwidth", 0.9, ["compile"])),
                        start=START.replace(check_quality=True), budget="55s", screening=True)
    assert summary["kept"][:1] == ["compile=default"]
    after = [entry["label"] for entry in summary["screened"]][1:]
    assert after, summary["stop_reason"]  # screened on the compiled best, not "needs about 22 s"
    assert not any("needs about 22 s" in why for why in summary["skipped"].values())
    assert summary["spent_s"] <= 55 * 1.05

"""tune's warm worker (perflab/tune/worker.py) and WarmRunner (perflab/tune/warm.py), with real processes: a warm trial
is the cold trial it replaces, only faster; a worker that crashes, runs out of memory or overruns its time limit is
replaced; no worker outlives its tune."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perflab.config import RunConfig
from perflab.results.quality import QualityVerdict
from perflab.tune.trial import ERROR, OK, OOM, TIMEOUT, TrialOutcome, run_trial, trial_figures
from perflab.tune.warm import WarmRunner, runs_cold
from perflab.workloads.reuse import BUILTIN_BUILD_INPUTS

ROOT = Path(__file__).resolve().parents[1]
PROBE = str(ROOT / "tests/planted/trial_probe.py") + ":build"
SLEEPY = str(ROOT / "tests/fixtures/sleepy_plugin.py") + ":build"
OOM_OVER_BATCH = str(ROOT / "tests/planted/oom_over_batch.py") + ":build"
TINY = RunConfig(workload="mlp", batch_size=8, steps=4, trials=2, warmup=1, device="cpu", quality_steps=2)
# A screen long enough that a throughput is a throughput on a shared 2-core machine (about 0.2 s of timed steps)
SCREEN = RunConfig(workload="mlp", steps=60, trials=3, warmup=2, device="cpu", quality_steps=3, check_quality=True)
# a warm and a cold throughput of one config lie within this factor of each other: on the shared 2-core CI machine
# the mlp's best trial lands near 25,000 or near 40,000 samples/s (1.6x apart), warm and cold alike, seen both ways
# round (a tolerance of +-50% failed at 39,037 warm against 25,713 cold under a neighbour's load)
SAME_WITHIN = 1.75


def throughput(outcome: TrialOutcome) -> float:
    """The best trial's samples/s: a neighbour on a shared 2-core machine only ever slows a trial down."""
    return max(trial.throughput_samples_per_s for trial in outcome.result.trials)


def without_seconds(quality: QualityVerdict) -> QualityVerdict:
    """The verdict less its time and less the note that its baseline came from the tune's cache."""
    from perflab.quality.gate import BASELINE
    return dataclasses.replace(quality, seconds=None, baseline=BASELINE)


def worker_pid(runner: WarmRunner) -> int:
    return runner.worker.process.pid


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_warm_screen_measures_what_a_cold_one_measures_and_costs_less(tmp_path):
    trials = tmp_path / "tune" / "trials"
    foreach = SCREEN.replace(optimizer_impl="foreach")  # switched inside the process (bf16 is emulated on AVX2)
    cold = run_trial(foreach, "run", trials / "cold")
    with WarmRunner() as runner:
        runner(SCREEN, "run", trials / "starts-the-worker")
        warm = runner(foreach, "run", trials / "warm")
        wider = runner(foreach.replace(workload_options={"hidden": 4096}), "run", trials / "wider")
    assert cold.status == warm.status == OK and warm.warm and not cold.warm
    # the same verdict from the same weights, inputs and losses, to the last bit; the warm trial's gate read the
    # fp32 baseline the cold trial's gate stored (another process, the same tune)
    assert without_seconds(warm.result.quality) == without_seconds(cold.result.quality)
    assert "earlier trial of this tune" in warm.result.quality.baseline
    assert "earlier trial" not in cold.result.quality.baseline
    assert 1 / SAME_WITHIN < throughput(warm) / throughput(cold) < SAME_WITHIN, (throughput(warm), throughput(cold))
    # the tolerance still tells configurations apart: 8x the hidden units is well outside it
    assert throughput(wider) / throughput(cold) < 1 / SAME_WITHIN, (throughput(wider), throughput(cold))
    assert warm.wall_s < cold.wall_s / 2, (warm.wall_s, cold.wall_s)
    assert trial_figures(warm)["warm"] is True and trial_figures(cold)["warm"] is False


def test_a_warm_trial_starts_from_the_weights_and_random_state_a_cold_trial_starts_from(tmp_path):
    record = tmp_path / "starts.jsonl"
    cfg = TINY.replace(workload=PROBE, workload_options={"record": str(record)})
    trials = tmp_path / "tune" / "trials"
    assert run_trial(cfg, "run", trials / "cold").status == OK
    with WarmRunner() as runner:
        assert runner(cfg, "run", trials / "builds").status == OK
        assert runner(cfg, "run", trials / "reuses-the-build").status == OK
    starts = record.read_text().splitlines()
    assert len(starts) == 3 and starts[0] == starts[1] == starts[2], starts


def test_the_reused_build_is_a_fresh_copy_each_time(tmp_path):
    from perflab.pipeline import load
    from perflab.workloads.reuse import reusing_builds
    cfg = TINY.replace(out=str(tmp_path))
    with reusing_builds() as builds:
        first = load("mlp", cfg)
        first.model.fc1.weight.data.add_(1.0)  # a run trains its copy
        second = load("mlp", cfg)
        third = load("mlp", cfg.replace(precision="bf16", steps=9))  # levers and counts are not build inputs
        other_seed = load("mlp", cfg.replace(seed=1))
    assert builds.builds == 2
    assert second.model is not first.model and not second.model.fc1.weight.equal(first.model.fc1.weight)
    assert second.model.fc1.weight.equal(third.model.fc1.weight)
    assert not other_seed.model.fc1.weight.equal(second.model.fc1.weight)


def test_a_worker_that_crashes_or_runs_out_of_memory_is_replaced_and_its_trial_recorded(tmp_path):
    trials = tmp_path / "tune" / "trials"
    crash = TINY.replace(workload=PROBE, workload_options={"exit_code": 7})
    out_of_memory = TINY.replace(workload=OOM_OVER_BATCH, batch_size=16)
    cold_crash = run_trial(crash, "run", trials / "cold-crash")
    with WarmRunner() as runner:
        warm_crash = runner(crash, "run", trials / "crash")
        assert runner.worker is None  # it died with the trial
        after_crash = runner(TINY, "run", trials / "after-crash")
        first_worker = worker_pid(runner)
        oom = runner(out_of_memory, "run", trials / "oom")
        assert runner.worker is None and not is_running(first_worker)  # it retired: an OOM may leave it unfit
        after_oom = runner(TINY, "run", trials / "after-oom")
    assert (warm_crash.status, warm_crash.reason) == (cold_crash.status, cold_crash.reason)  # its log's last line
    assert warm_crash.status == ERROR and warm_crash.warm
    assert oom.status == OOM and oom.warm and "out of memory" in oom.reason
    assert after_crash.status == after_oom.status == OK and after_crash.warm and after_oom.warm


def test_a_trial_over_its_time_limit_is_a_timeout_and_the_next_runs_warm_on_a_new_worker(tmp_path):
    trials = tmp_path / "tune" / "trials"
    hangs = TINY.replace(workload=SLEEPY, compile="default", warmup=2)  # it sleeps 600 s in its build
    with WarmRunner() as runner:
        assert runner(TINY, "run", trials / "first").status == OK
        first_worker = worker_pid(runner)
        began = time.perf_counter()
        stopped = runner(hangs, "run", trials / "hangs", time_limit_s=2)
        assert time.perf_counter() - began < 2 + 1.5
        assert stopped.status == TIMEOUT and stopped.warm and "stopped after 2 s" in stopped.reason
        assert not is_running(first_worker)
        after = runner(TINY, "run", trials / "after", time_limit_s=60)
        assert after.status == OK and after.warm and worker_pid(runner) != first_worker


def test_trials_that_change_the_process_run_cold_as_the_levers_declare(tmp_path):
    assert not runs_cold(TINY, "run") and not runs_cold(TINY.replace(precision="bf16", compile="default"), "profile")
    assert runs_cold(TINY.replace(workers=2), "run") and runs_cold(TINY.replace(nproc=2), "run")
    assert runs_cold(TINY, "serve")
    cold_calls = []

    def cold(cfg, kind, out, time_limit_s=None, serve=None):
        cold_calls.append((cfg.workers, time_limit_s))
        return TrialOutcome(OK, 0.1)
    trials = tmp_path / "tune" / "trials"
    with WarmRunner(cold=cold) as runner:
        assert runner(TINY, "run", trials / "warm").warm
        worker = worker_pid(runner)
        assert not runner(TINY.replace(workers=2), "run", trials / "cold", time_limit_s=30).warm
        assert runner.worker is None and not is_running(worker)  # on a GPU it would be the cold trial's neighbour
    assert cold_calls == [(2, 30)]


def test_the_builtin_build_inputs_name_every_field_a_builtin_build_reads():
    read = set()
    for path in (ROOT / "perflab" / "workloads").glob("*.py"):
        read |= set(re.findall(r"\bcfg\.([a-z_]+)\b", path.read_text()))
    read -= {"replace", "to_dict"}
    assert read <= set(BUILTIN_BUILD_INPUTS), read - set(BUILTIN_BUILD_INPUTS)


def _workers_of(parent_pid: int) -> list[int]:
    """The warm workers started by `parent_pid` (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"perflab.tune.worker" in command and str(parent_pid).encode() in command and is_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_no_worker_outlives_its_tune_when_the_tune_is_interrupted_or_terminated(tmp_path, sig):
    out = tmp_path / "tune"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    tune = subprocess.Popen([sys.executable, "-m", "perflab", "tune", "--workload", "mlp", "--batch", "8", "--device",
                             "cpu", "--steps", "10000000", "--trials", "1", "--warmup", "1", "--budget", "10m",
                             "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        workers = _wait_for(lambda: _workers_of(tune.pid), 120, "a warm worker started")
        log = out / "trials" / "00-start.log"
        _wait_for(lambda: log.is_file() and "preparing" in log.read_text(), 120, "the start trial running")
        tune.send_signal(sig)
        tune.wait(timeout=60)
        _wait_for(lambda: not any(is_running(pid) for pid in workers), 10, "the worker ended with its tune")
    finally:
        tune.kill()
        tune.communicate()
        for pid in _workers_of(tune.pid):  # left behind by a failure: not by this test's next run
            os.kill(pid, signal.SIGKILL)


def test_tune_records_which_trials_ran_warm(tmp_path):
    from perflab.cli import main
    from perflab.sweep import read_rows
    out = tmp_path / "tune"
    assert main(["tune", "--workload", "mlp", "--batch", "8", "--steps", "4", "--trials", "2", "--warmup", "1",
                 "--device", "cpu", "--quality-steps", "2", "--exclude", "compile", "--max-trials", "2",
                 "--out", str(out)]) == 0
    rows = read_rows(out / "tune.jsonl")
    assert [row["warm"] for row in rows] == [True, True]
    assert json.loads((out / "tune.json").read_text())["warm_trials"] == 2


def test_the_trial_that_starts_the_worker_records_the_start_apart_and_the_next_pays_none(tmp_path):
    # the worker's start (the interpreter, torch, the perflab import) is the first warm trial's, once: it is not a
    # cost a later warm trial pays, so tune's estimates read it apart (setup_s)
    trials = tmp_path / "tune" / "trials"
    with WarmRunner() as runner:
        first = runner(TINY, "run", trials / "first")
        second = runner(TINY, "run", trials / "second")
    assert first.status == second.status == OK
    assert first.setup_s is not None and 0.0 < first.setup_s < first.wall_s
    assert second.setup_s is None  # the worker was warm
    assert first.setup_s > second.wall_s, (first.setup_s, second.wall_s)  # more than a whole warm trial costs
    assert trial_figures(first)["setup_s"] == first.setup_s and trial_figures(second)["setup_s"] is None

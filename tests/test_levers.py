"""The existing levers on CPU: each refusal rule, the `levers` listing, and each CPU-capable lever end to end."""
import json
import subprocess
import sys

import pytest
import torch

from perflab import cli
from perflab.cli import main
from perflab.config import RunConfig
from perflab.levers.plan import build_plan
from perflab.pipeline import resolve_config
from perflab.levers import all_levers
from perflab.levers.cuda_graphs import _restore_training_state, _training_state
from perflab.workloads import load_workload

TINY = ["--steps", "2", "--warmup", "1", "--trials", "1", "--quality-steps", "2", "--device", "cpu"]

REFUSALS = [
    (["--workload", "mlp", "--precision", "fp16"], "--precision fp16 needs a CUDA GPU"),
    (["--workload", "mlp", "--precision", "tf32"], "--precision tf32 needs a CUDA GPU"),
    (["--workload", "mlp", "--cuda-graphs"], "--cuda-graphs needs a CUDA GPU"),
    (["--workload", "resnet50", "--cudnn-benchmark"], "--cudnn-benchmark needs a CUDA GPU"),
    (["--workload", "mlp", "--prefetcher", "stream"], "--prefetcher stream needs a CUDA GPU"),
    (["--workload", "mlp", "--pin-memory"], "--pin-memory needs a CUDA GPU"),
    (["--workload", "mlp", "--persistent-workers"], "only applies with DataLoader workers; add --workers N"),
    (["--workload", "mlp", "--prefetch-factor", "4"], "only applies with DataLoader workers; add --workers N"),
    (["--workload", "mlp", "--channels-last"], "mlp has no 2-D convolutions"),
    (["--workload", "mlp", "--mode", "infer", "--optimizer-impl", "foreach"], "only applies to --mode train"),
    (["--workload", "mlp", "--compile", "--warmup", "1"], "use --warmup 2 or more"),
    (["--workload", "mlp", "--compile", "reduce-overhead", "--cuda-graphs"], "capture CUDA graphs themselves"),
    (["--workload", "resnet50", "--workers", "2"], "resnet50 runs on batches pre-staged on the device"),
    (["--workload", "resnet50", "--workers", "2", "--persistent-workers"], "pre-staged on the device"),
    (["--workload", "resnet50", "--workers", "2", "--prefetch-factor", "4"], "pre-staged on the device"),
]


@pytest.mark.parametrize("args, message", REFUSALS, ids=[" ".join(args[2:]) for args, _ in REFUSALS])
def test_lever_that_does_not_apply_is_refused_in_one_line_before_anything_runs(args, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *args, "--device", "cpu", "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "refused" in err and message in err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_refused_lever_exits_2_without_traceback_or_run_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "perflab", "run", "--workload", "mlp", "--precision", "fp16",
                           "--device", "cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --precision fp16 refused: --precision fp16 needs a CUDA GPU and this run is on cpu; "
        "drop the flag or use --device cuda"]
    assert not any((tmp_path / "runs").glob("*"))


def test_levers_command_lists_every_lever_with_its_flag(capsys, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)
    assert main(["levers"]) == 0
    listing = capsys.readouterr().out
    for lever in all_levers():
        assert lever.name in listing and lever.flag in listing, lever.name
    assert "--compile [default|reduce-overhead|max-autotune]" in listing  # not eaten as rich markup


END_TO_END = [
    (["--workload", "mlp", "--optimizer-impl", "foreach"], ["foreach-optimizer"], None),
    (["--workload", "mlp", "--optimizer-impl", "fused"], ["fused-optimizer"], "pass"),
    (["--workload", "mlp", "--precision", "bf16"], ["bf16"], "pass"),
    (["--workload", "mlp", "--mode", "infer", "--precision", "bf16"], ["bf16"], "pass"),
    (["--workload", "mlp", "--workers", "2", "--persistent-workers", "--prefetch-factor", "2"],
     ["workers", "persistent-workers", "prefetch-factor"], None),
    (["--workload", "driving", "--channels-last", "--option", "image_res=32", "--batch", "2"],
     ["channels-last"], "pass"),
]


@pytest.mark.parametrize("args, levers, verdict", END_TO_END, ids=[" ".join(args[1:]) for args, _, _ in END_TO_END])
def test_cpu_lever_runs_end_to_end(args, levers, verdict, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *args, *TINY, "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["levers"] == levers
    assert result["metrics"]["throughput_samples_per_s"]["median"] > 0
    assert (result["quality"] or {}).get("verdict") == verdict


def _inductor_unavailable() -> str:
    try:
        torch.compile(torch.nn.Linear(2, 2))(torch.randn(1, 2))
    except Exception as err:  # inductor needs a working C++ toolchain on CPU
        return f"torch.compile does not work here: {type(err).__name__}: {err}"
    return ""


def test_compile_runs_end_to_end_on_cpu(tmp_path):
    reason = _inductor_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "run"
    assert main(["run", "--workload", "mlp", "--mode", "infer", "--compile", *TINY, "--warmup", "2",
                 "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["levers"] == ["compile"]
    assert result["metrics"]["compile_s"] > 0
    assert result["quality"]["verdict"] == "pass", result["quality"]["reason"]


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adamw"])
def test_undoing_the_graph_warm_up_leaves_weights_as_if_it_never_trained(optimizer):
    """CUDA graphs train a few warm-up iterations before capture; undoing them must equal a fresh start."""
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8,
                                   workload_options={"in_features": "16", "hidden": "8"}), None)
    plans = []
    for _ in range(2):
        workload = load_workload("mlp", cfg)
        if optimizer == "adamw":
            workload.optimizer_factory = lambda params: torch.optim.AdamW(params, lr=1e-2)
        plans.append(build_plan(workload, cfg, torch.device("cpu")))
    fresh, warmed = plans
    warmed.model.load_state_dict(fresh.model.state_dict())
    inputs, target = torch.randn(8, 16), torch.randint(0, 10, (8,))

    def step(plan):
        plan.loss_fn(plan.model(inputs), target).backward()
        plan.optimizer.step()
        plan.optimizer.zero_grad(set_to_none=True)

    saved = _training_state(warmed)
    for _ in range(3):
        step(warmed)
    _restore_training_state(warmed, saved)
    for _ in range(2):
        step(fresh)
        step(warmed)
    for a, b in zip(fresh.model.parameters(), warmed.model.parameters()):
        torch.testing.assert_close(a, b)


def test_cudnn_benchmark_is_switched_for_the_run_only_and_refused_without_convolutions():
    from perflab.levers.cudnn import LEVERS, set_cudnn_benchmark

    before = torch.backends.cudnn.benchmark
    restore = set_cudnn_benchmark(not before)
    assert torch.backends.cudnn.benchmark is (not before)
    restore()
    assert torch.backends.cudnn.benchmark is before
    lever = LEVERS[0]
    cfg = RunConfig(workload="mlp", cudnn_benchmark=True)
    mlp, driving = load_workload("mlp", cfg), load_workload("driving", RunConfig(workload="driving"))
    assert "mlp has no convolutions" in lever.checks(cfg, mlp, torch.device("cuda"))
    assert lever.checks(cfg, driving, torch.device("cuda")) is None
    assert lever.changes_numerics and lever.needs_cuda

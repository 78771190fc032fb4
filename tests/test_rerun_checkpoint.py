"""perflab rerun and training checkpoints: same config and seed again; save and resume training state."""
import random

import numpy as np
import pytest
import torch

from perflab import RunConfig
from perflab.checkpoint import load_checkpoint, save_checkpoint
from perflab.cli import main
from perflab.errors import PerflabError
from perflab.levers.plan import build_plan
from perflab.pipeline import resolve_config, resolve_device
from perflab.results import Result
from perflab.workloads import load_workload

TINY = ["--workload", "mlp", "--steps", "4", "--trials", "2", "--warmup", "1", "--device", "cpu"]




def mlp_plan(seed: int = 0, **options):
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", batch_size=8, seed=seed,
                                   workload_options={k: str(v) for k, v in options.items()}), None)
    torch.manual_seed(seed)
    return build_plan(load_workload("mlp", cfg), cfg, resolve_device("cpu"))


def train_one_step(plan):
    inputs, target = torch.randn(8, 1024), torch.randint(0, 10, (8,))
    plan.loss_fn(plan.model(inputs), target).backward()
    plan.optimizer.step()
    plan.optimizer.zero_grad()


def test_rerun_repeats_the_recorded_config_and_seed(tmp_path):
    assert main(["run", *TINY, "--batch", "16", "--seed", "7", "--out", str(tmp_path / "first")]) == 0
    assert main(["rerun", str(tmp_path / "first" / "result.json"), "--out", str(tmp_path / "again")]) == 0
    first, again = Result.load(tmp_path / "first"), Result.load(tmp_path / "again")
    assert first.config.replace(out=None) == again.config.replace(out=None)
    assert again.config.seed == 7
    assert any("rerun of" in note for note in again.notes)


def test_checkpoint_restores_weights_optimizer_and_rng_states(tmp_path):
    plan = mlp_plan()
    train_one_step(plan)  # momentum buffers exist now
    path = save_checkpoint(tmp_path / "checkpoint.pt", plan, step=5)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    weights = {k: v.clone() for k, v in plan.model.state_dict().items()}

    fresh = mlp_plan(seed=1)  # different initial weights
    assert load_checkpoint(path, fresh) == 5
    for name, value in fresh.model.state_dict().items():
        assert torch.equal(value, weights[name])
    momentum = [fresh.optimizer.state[p]["momentum_buffer"] for p in fresh.model.parameters()]
    assert all(buffer is not None and buffer.abs().sum() > 0 for buffer in momentum)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_checkpoint_every_n_steps_is_timed_as_its_own_phase_and_resumable(tmp_path):
    first = tmp_path / "first"
    assert main(["run", *TINY, "--checkpoint-every", "2", "--out", str(first)]) == 0
    result = Result.load(first)
    assert result.metrics.phases_ms["checkpoint"] > 0
    assert result.timing["checkpoint"]["saves"] == 4  # 2 trials x 4 steps, every 2
    assert (first / "checkpoint.pt").is_file()
    assert not [p for p in first.iterdir() if p.name.startswith(".checkpoint.pt")], "no temp files left"

    assert main(["run", *TINY, "--resume-from", str(first), "--out", str(tmp_path / "resumed")]) == 0
    resumed = Result.load(tmp_path / "resumed")
    assert resumed.timing["checkpoint"]["resumed_at_step"] == 1 + 8  # warm-up + timed steps of the first run


def test_interrupted_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    plan = mlp_plan()
    path = save_checkpoint(tmp_path / "checkpoint.pt", plan, step=1)
    before = path.read_bytes()

    def killed(obj, target, *args, **kwargs):
        with open(target, "wb") as stream:
            stream.write(b"half a checkpo")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, plan, step=2)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_resume_from_a_different_model_is_a_clear_error(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", mlp_plan(), step=1)
    with pytest.raises(PerflabError, match="does not match"):
        load_checkpoint(path, mlp_plan(hidden=256))


def test_resume_from_garbage_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["run", *TINY, "--resume-from", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "cannot read it as a perflab checkpoint" in capsys.readouterr().err


def test_checkpoints_are_refused_for_inference():
    with pytest.raises(PerflabError, match="training runs"):
        RunConfig(workload="mlp", mode="infer", checkpoint_every=2).validate()

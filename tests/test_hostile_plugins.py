"""A plugin that breaks the Workload contract is refused before any timed step, in one line naming its mistake and
what to do (exit 2, no traceback): a loss that is not a scalar tensor requiring grad, a dataset whose __len__ is not
a non-negative int (its own exception shows the user's frame), a model left on the meta device."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_process import perflab_cli

RUN = ["--device", "cpu", "--batch", "2", "--steps", "1", "--warmup", "1", "--trials", "1"]

PLUGIN = '''\
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset
import perflab


class Counted(Dataset):
    def __init__(self, length):
        self.length = length
        self.items = TensorDataset(torch.randn(8, 4), torch.randint(0, 4, (8,)))

    def __len__(self):
        if self.length == "raise":
            raise ValueError("cannot count the shards")
        return self.length

    def __getitem__(self, index):
        return self.items[index % 8]


def workload(loss_fn=nn.CrossEntropyLoss(), dataset=None, model=None):
    model = nn.Linear(4, 4) if model is None else model
    dataset = Counted(8) if dataset is None else dataset  # not `dataset or`: bool() would ask its __len__
    return perflab.Workload(model=model, dataset=dataset, loss_fn=loss_fn)


def vector(cfg):
    return workload(loss_fn=lambda out, target: (out - 1).pow(2).mean(1))


def python_float(cfg):
    return workload(loss_fn=lambda out, target: float(out.detach().sum()))


def detached(cfg):
    return workload(loss_fn=lambda out, target: out.detach().sum())


def one_element(cfg):
    return workload(loss_fn=lambda out, target: out.sum().reshape(1))


def negative_length(cfg):
    return workload(dataset=Counted(-3))


def float_length(cfg):
    return workload(dataset=Counted(8.0))


def raising_length(cfg):
    return workload(dataset=Counted("raise"))


def on_meta(cfg):
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    return workload(model=model)
'''


@pytest.fixture
def plugin(tmp_path) -> Path:
    path = tmp_path / "hostile.py"
    path.write_text(PLUGIN)
    return path


def line_of(plugin: Path, text: str) -> int:
    return next(number for number, line in enumerate(plugin.read_text().splitlines(), 1) if text in line)


def refused(plugin: Path, build: str, *argv: str, command: str = "run") -> str:
    done = perflab_cli(command, "--workload", f"{plugin}:{build}", *RUN, *argv, "--out", str(plugin.parent / "o"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "warm-up" not in done.stderr  # refused before any step is timed
    assert not (plugin.parent / "o").exists()
    return done.stderr


@pytest.mark.parametrize("build,marker,says", [
    ("vector", "def vector", "returned a tensor of shape (2,), not a scalar; reduce it to one number"),
    ("python_float", "def python_float", "returned a float, not a tensor; return the loss tensor itself"),
    ("detached", "def detached", "returned a tensor that does not require grad, so backward cannot reach the model"),
])
def test_a_loss_that_backward_cannot_start_from_is_one_line_naming_the_loss(plugin, build, marker, says):
    stderr = refused(plugin, build)
    error = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"hostile: Workload.loss_fn at {plugin}:{line_of(plugin, marker) + 1}" in error[0]
    assert says in error[0]


def test_a_one_element_loss_trains_and_a_vector_loss_still_infers(plugin, tmp_path):
    assert perflab_cli("run", "--workload", f"{plugin}:one_element", *RUN, "--out", str(tmp_path / "t")).returncode == 0
    inferred = perflab_cli("run", "--workload", f"{plugin}:vector", *RUN, "--mode", "infer", "--out", str(tmp_path / "i"))
    assert inferred.returncode == 0, inferred.stderr


def test_memory_checks_the_loss_before_its_first_step(plugin):
    stderr = refused(plugin, "vector", command="memory")
    assert "not a scalar" in stderr


@pytest.mark.parametrize("build,says", [
    ("negative_length", "Workload.dataset's __len__ at {where} returned -3; it must return the number of items, 0 or"),
    ("float_length", "Workload.dataset's __len__ at {where} returned 8.0 (float); it must return the number of items "
                     "as an int"),
])
def test_a_dataset_length_that_is_not_a_count_is_one_line(plugin, build, says):
    stderr = refused(plugin, build)
    assert says.format(where=f"{plugin}:{line_of(plugin, 'def __len__')}") in stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1


def test_a_dataset_length_that_raises_shows_the_users_frame(plugin):
    stderr = refused(plugin, "raising_length")
    assert (f"asking your {plugin}:raising_length Workload.dataset for its length (__len__) raised ValueError: cannot "
            "count the shards") in stderr
    assert f"{plugin}:{line_of(plugin, 'raise ValueError')} in __len__" in stderr
    assert "site-packages" not in stderr and "perflab/workloads" not in stderr


def test_a_model_on_the_meta_device_is_told_how_to_materialise_it(plugin):
    stderr = refused(plugin, "on_meta", "--mode", "infer")
    assert "Workload.model has tensors on the meta device (shapes without data: weight and 1 more)" in stderr
    assert "model.to_empty(device='cpu')" in stderr

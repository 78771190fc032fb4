"""How perflab calls a model (dict -> keywords, tuple -> positional, tensor -> one argument) and how the
quality gate reads what the model returns (tensor, tuple, dict, dataclass, a transformers-style ModelOutput)."""
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch
from torch import nn

import perflab
from perflab.config import RunConfig
from perflab.errors import PerflabError, UserCodeError
from perflab.step.calls import call_model, compared_tensors, inputs_from_call, logits_of
from perflab.pipeline import resolve_config, resolve_device
from perflab.levers import check_levers
from perflab.quality import INFER_RTOL, judge_outputs, observe_output
from perflab.workloads import load_workload

PLUGIN = "tests/plugins/dict_model.py"


class Echo(nn.Module):
    """Returns how it was called."""

    def forward(self, *args, **kwargs):
        return args, kwargs


def test_dict_inputs_are_keyword_arguments_tuples_positional_and_a_tensor_one_argument():
    a, b = torch.ones(2), torch.zeros(2)
    assert call_model(Echo(), {"input_ids": a, "attention_mask": b}) == ((), {"input_ids": a, "attention_mask": b})
    assert call_model(Echo(), (a, b)) == ((a, b), {})
    assert call_model(Echo(), [a, b]) == ((a, b), {})
    assert call_model(Echo(), a) == ((a,), {})


@pytest.mark.parametrize("inputs", [torch.ones(2), (torch.ones(2), torch.zeros(2)), {"x": torch.ones(2)},
                                    ((torch.ones(2), torch.zeros(2)),), ({"x": torch.ones(2)},)])
def test_inputs_seen_by_a_stand_in_model_call_the_real_model_the_same_way(inputs):
    args, kwargs = call_model(Echo(), inputs)
    assert call_model(Echo(), inputs_from_call(args, kwargs)) == (args, kwargs)


def test_a_failing_forward_says_what_perflab_was_calling_it_with():
    def forward(input_ids, attention_mask):
        raise ValueError("bad shapes")
    with pytest.raises(UserCodeError, match="calling your model's forward on a batch of type dict with keys "
                                            "input_ids, attention_mask raised ValueError: bad shapes") as caught:
        call_model(forward, {"input_ids": torch.ones(1), "attention_mask": torch.ones(1)})
    assert [frame.function for frame in caught.value.frames] == ["forward"]
    assert caught.value.frames[0].file == __file__


@dataclass
class ClassifierOutput:
    logits: torch.Tensor
    pooled: Optional[torch.Tensor] = None


@dataclass
class ModelOutputLike(OrderedDict):
    """What transformers' ModelOutput is: a dataclass and an OrderedDict of its non-None fields."""

    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                self[field.name] = value


LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 1.5, 0.3], [-0.4, 0.2, 3.0], [1.0, -2.0, 0.5]])
POOLED = torch.linspace(-1, 1, 8).reshape(4, 2)
IDS = torch.arange(4)  # an integer tensor: not compared


def make_output(kind: str, logits: torch.Tensor, pooled: torch.Tensor):
    if kind == "tensor":
        return logits
    if kind == "tuple":
        return logits, pooled, IDS
    if kind == "dict":
        return {"pooled": pooled, "logits": logits, "ids": IDS}
    if kind == "dataclass":
        return ClassifierOutput(logits=logits, pooled=pooled)
    return ModelOutputLike(logits=logits, hidden_states=(pooled,))


KINDS = ["tensor", "tuple", "dict", "dataclass", "model-output"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_floating_tensor_of_an_output_is_compared_and_the_logits_found(kind):
    output = make_output(kind, LOGITS, POOLED)
    tensors = compared_tensors(output, None)
    assert all(tensor.is_floating_point() for tensor in tensors)
    assert len(tensors) == (1 if kind == "tensor" else 2)
    assert logits_of(output, None) is LOGITS


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_one_percent_logits_change_fails_the_fp32_gate_and_an_identical_output_passes(kind):
    def judged(candidate_logits):
        baseline = [observe_output(make_output(kind, LOGITS, POOLED), None)]
        candidate = [observe_output(make_output(kind, candidate_logits, POOLED), None)]
        return judge_outputs(baseline, candidate, INFER_RTOL["fp32"], "fp32 default", is_classifier=True)
    same = judged(LOGITS.clone())
    assert same.verdict == "pass" and same.metrics.rel_error == 0
    assert same.metrics.top1_agreement == 1.0 and same.metrics.top1_samples == 4
    changed = judged(LOGITS * 1.01)
    assert changed.verdict == "fail" and "relative output error" in changed.reason


def test_output_key_compares_only_that_entry():
    baseline = observe_output(make_output("dict", LOGITS, POOLED), "logits")
    moved = observe_output(make_output("dict", LOGITS, POOLED * 2), "logits")
    assert judge_outputs([baseline], [moved], 1e-5, "fp32 default", True).verdict == "pass"
    everything = [observe_output(make_output("dict", LOGITS, p), None) for p in (POOLED, POOLED * 2)]
    assert judge_outputs(everything[:1], everything[1:], 1e-5, "fp32 default", True).verdict == "fail"


def test_top1_reads_the_logits_entry_even_when_another_tensor_comes_first():
    output = {"pooled": POOLED, "logits": LOGITS}
    observed = observe_output(output, None)
    assert observed.logits.shape == (4, 3)


def test_an_output_key_the_output_lacks_names_the_entries_it_has():
    with pytest.raises(PerflabError, match="output has no such entry \\(its entries are logits, pooled\\)"):
        compared_tensors(ClassifierOutput(logits=LOGITS, pooled=POOLED), "scores")


def test_workload_name_defaults_to_the_plugin_file_stem():
    cfg = resolve_config(RunConfig(workload=PLUGIN, device="cpu", batch_size=2), None)
    assert load_workload(PLUGIN, cfg).name == "dict_model"


def test_module_spec_without_a_name_is_named_after_the_module(tmp_path, monkeypatch):
    (tmp_path / "nameless_pkg.py").write_text(
        "import torch, perflab\n"
        "def build(cfg):\n"
        "    return perflab.Workload(model=torch.nn.Linear(4, 2), dataset=[(torch.ones(4), 0)])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = resolve_config(RunConfig(workload="nameless_pkg:build", device="cpu", batch_size=1, mode="infer"), None)
    assert load_workload("nameless_pkg:build", cfg).name == "nameless_pkg"


def test_cuda_graphs_on_a_dict_input_model_are_refused_on_cpu_with_the_reason():
    cfg = resolve_config(RunConfig(workload=PLUGIN, device="cpu", batch_size=2, cuda_graphs=True), None)
    with pytest.raises(PerflabError, match="--cuda-graphs.*CUDA"):
        check_levers(cfg, load_workload(PLUGIN, cfg), resolve_device("cpu"))


def test_running_out_of_memory_in_forward_is_not_called_the_users_fault():
    """A sweep records out-of-memory as a point's outcome, so it must arrive as torch raised it."""
    def forward(inputs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        call_model(forward, torch.ones(1))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("levers", [{"cuda_graphs": True}, {"compile": "default", "precision": "bf16"},
                                    {"compile": "default", "cuda_graphs": True, "precision": "bf16"}],
                         ids=["graphs", "compile", "compile+graphs"])
def test_graphed_and_compiled_steps_call_a_dict_input_model_and_pass_the_gate(mode, levers):
    plugin = str(Path(__file__).resolve().parent / "plugins" / "dict_model.py")
    cfg = RunConfig(workload=plugin, device="cuda", batch_size=4, steps=3, warmup=2, trials=1, mode=mode,
                    check_quality=True, quality_steps=2, **levers)
    result = perflab.run(plugin, cfg)
    assert result.quality.verdict == "pass", result.quality.reason
    assert result.workload["name"] == "dict_model"

"""The quality gate: candidate vs the fp32 eager baseline from the same weights, seed and inputs."""
import dataclasses
import json

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from perflab import RunConfig, Workload
from perflab.cli import main
from perflab.errors import PerflabError
from perflab.pipeline import resolve_config
from perflab.levers import optimizer as optimizer_levers
from perflab.levers import precision as precision_levers
from perflab.quality import with_noise_floor, run_quality_gate, top1_flips
from perflab.workloads import load_workload

CPU = torch.device("cpu")
TINY = ["--steps", "2", "--warmup", "1", "--trials", "1", "--quality-steps", "3", "--device", "cpu"]


def gate(workload_name: str = "mlp", workload=None, **config):
    cfg = resolve_config(RunConfig(workload=workload_name, device="cpu", quality_steps=3, **config), None)
    workload = workload or load_workload(cfg.workload, cfg)
    return run_quality_gate(workload, cfg, CPU)


def plant(monkeypatch, module, lever_name: str, extra) -> None:
    """Replace a lever in `module.LEVERS` by one that also runs `extra(plan, cfg)`: a wrong lever."""
    def wrong(lever):
        def apply(plan, cfg):
            lever.apply(plan, cfg)
            extra(plan, cfg)
        return dataclasses.replace(lever, apply=apply)
    monkeypatch.setattr(module, "LEVERS", [wrong(lever) if lever.name == lever_name else lever
                                           for lever in module.LEVERS])


def scale_first_layer(plan, cfg) -> None:
    with torch.no_grad():
        plan.eager_model.fc1.weight.mul_(3.0)


def poison_one_weight(plan, cfg) -> None:
    with torch.no_grad():
        plan.eager_model.fc1.weight[0, 0] = float("nan")


def autocast_fp16(plan, cfg) -> None:
    plan.autocast_dtype = torch.float16  # fp16 forced onto a CPU run: what --precision fp16 does on CUDA


def big_output_workload() -> Workload:
    """Outputs around 4e4, some beyond fp16's 65504: fine in fp32, inf in fp16."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Linear(16, 4)
    with torch.no_grad():
        model.weight.fill_(1e4)
        model.bias.zero_()
    dataset = TensorDataset(torch.randn(64, 16, generator=gen), torch.zeros(64, dtype=torch.long))
    return Workload(name="big-outputs", model=model, dataset=dataset, loss_fn=nn.CrossEntropyLoss())


def test_gate_passes_an_equivalent_optimizer_implementation():
    quality = gate(optimizer_impl="foreach")
    assert quality.verdict == "pass", quality.reason
    assert quality.mode == "train" and quality.steps == 3
    assert quality.metrics.final_loss_rel_delta <= 1e-4
    assert len(quality.metrics.candidate_losses) == 3
    assert quality.candidate.levers == ["foreach-optimizer"]


def test_gate_passes_channels_last_on_a_conv_model_within_fp32_tolerance():
    quality = gate("augment", mode="infer", channels_last=True, batch_size=4)
    assert quality.verdict == "pass", quality.reason
    assert quality.tolerances.rtol == 1e-5
    assert quality.metrics.rel_error < 1e-5
    assert quality.metrics.top1_agreement == 1.0


def test_gate_passes_bf16_within_its_tolerance_and_sees_the_autocast():
    quality = gate(mode="infer", precision="bf16")
    assert quality.verdict == "pass", quality.reason
    # the gate ran the candidate under bf16 autocast, as the timed run does: the error is bf16-sized
    assert 1e-4 < quality.metrics.rel_error <= quality.tolerances.rtol == 2e-2


def test_gate_passes_bf16_training_and_records_both_loss_trajectories():
    quality = gate(precision="bf16")
    assert quality.verdict == "pass", quality.reason
    metrics = quality.metrics
    assert metrics.baseline_losses != metrics.candidate_losses
    assert metrics.final_loss_rel_delta <= quality.tolerances.rtol
    assert quality.tolerances.precision_rtol == 1e-2
    assert quality.tolerances.noise_floor is not None


def test_gate_feeds_the_baseline_the_batches_the_candidates_gpu_augmentation_made():
    # --augment gpu: the dataset yields raw uint8 images and the candidate's data path augments them at
    # random; the baseline must train on exactly those augmented batches, so fp32 losses match exactly
    quality = gate("augment", augment="gpu", batch_size=4)
    assert quality.verdict == "pass", quality.reason
    assert quality.metrics.baseline_losses == quality.metrics.candidate_losses


def test_gate_fails_a_lever_that_changes_the_weights(monkeypatch):
    plant(monkeypatch, optimizer_levers, "foreach-optimizer", scale_first_layer)
    quality = gate(optimizer_impl="foreach")
    assert quality.verdict == "fail"
    assert "relative delta" in quality.reason
    assert quality.metrics.final_loss_rel_delta > quality.tolerances.rtol


def test_gate_fails_inference_outputs_that_differ(monkeypatch):
    plant(monkeypatch, precision_levers, "bf16", scale_first_layer)
    quality = gate(mode="infer", precision="bf16")
    assert quality.verdict == "fail"
    assert quality.metrics.rel_error > 2e-2
    assert "relative output error" in quality.reason


def test_gate_fails_fp16_outputs_that_overflow_to_inf(monkeypatch):
    plant(monkeypatch, precision_levers, "bf16", autocast_fp16)
    quality = gate(workload=big_output_workload(), mode="infer", precision="bf16", batch_size=8)
    assert quality.verdict == "fail"
    assert quality.metrics.non_finite_candidate > 0
    assert "NaN/inf" in quality.reason


def test_gate_fails_a_training_loss_that_goes_nan(monkeypatch):
    plant(monkeypatch, precision_levers, "bf16", poison_one_weight)
    quality = gate(precision="bf16")
    assert quality.verdict == "fail"
    assert "NaN/inf from step 0" in quality.reason


def test_gate_leaves_the_workload_of_the_timed_run_untouched(monkeypatch):
    plant(monkeypatch, optimizer_levers, "foreach-optimizer", scale_first_layer)
    cfg = resolve_config(RunConfig(workload="mlp", device="cpu", optimizer_impl="foreach", quality_steps=2), None)
    workload = load_workload("mlp", cfg)
    before = {name: tensor.clone() for name, tensor in workload.model.state_dict().items()}
    dataset = workload.dataset
    run_quality_gate(workload, cfg, CPU)
    assert workload.dataset is dataset
    for name, tensor in workload.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_noise_floor_widens_the_loss_tolerance_only_when_the_baseline_is_that_sensitive():
    default = {"rtol": 1e-4, "source": "fp32 default"}
    chaotic = with_noise_floor(default, baseline=[2.0, 1.0], nudged=[2.0, 1.1])
    assert chaotic.rtol == pytest.approx(0.3) and chaotic.precision_rtol == 1e-4
    assert chaotic.source.startswith("noise floor")
    calm = with_noise_floor(default, baseline=[2.0, 1.0], nudged=[2.0, 1.0000001])
    assert calm.rtol == 1e-4 and calm.source == "fp32 default"


def test_top1_flip_between_near_tied_classes_is_not_decisive():
    baseline = torch.tensor([[1.0, 0.999, -5.0], [3.0, 0.0, 0.0]])
    candidate = torch.tensor([[0.999, 1.0, -5.0], [0.0, 3.0, 0.0]])
    samples, flips, decisive = top1_flips(candidate, baseline, rtol=1e-2)
    assert (samples, flips, decisive) == (2, 2, 1)


def test_run_records_the_quality_figures_and_verdict_in_result_json(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--workload", "mlp", "--mode", "infer", "--precision", "bf16", *TINY, "--out", str(out)]) == 0
    quality = json.loads((out / "result.json").read_text())["quality"]
    assert quality["verdict"] == "pass"
    assert quality["batches"] == 3 and quality["mode"] == "infer"
    assert quality["tolerances"] == {"rtol": 2e-2, "source": "bf16 default"}
    assert 0 < quality["metrics"]["rel_error"] < 2e-2
    assert len(quality["metrics"]["rel_error_per_batch"]) == 3


def test_failed_gate_exits_1_and_still_saves_the_result(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--workload", "mlp", "--mode", "infer", "--precision", "bf16", "--quality-rtol", "1e-7",
                 *TINY, "--out", str(out)])
    assert code == 1
    assert "quality gate failed" in capsys.readouterr().out
    quality = json.loads((out / "result.json").read_text())["quality"]
    assert quality["verdict"] == "fail"
    assert quality["tolerances"] == {"rtol": 1e-7, "source": "--quality-rtol"}


def test_no_check_quality_skips_the_gate_and_check_quality_forces_it(tmp_path):
    skipped, forced, default = tmp_path / "skipped", tmp_path / "forced", tmp_path / "default"
    assert main(["run", "--workload", "mlp", "--precision", "bf16", "--no-check-quality", *TINY,
                 "--out", str(skipped)]) == 0
    assert json.loads((skipped / "result.json").read_text())["quality"] is None
    # foreach does not change numerics, so by default no gate runs; --check-quality asks for one
    assert main(["run", "--workload", "mlp", "--optimizer-impl", "foreach", *TINY, "--out", str(default)]) == 0
    assert json.loads((default / "result.json").read_text())["quality"] is None
    assert main(["run", "--workload", "mlp", "--optimizer-impl", "foreach", "--check-quality", *TINY,
                 "--out", str(forced)]) == 0
    assert json.loads((forced / "result.json").read_text())["quality"]["verdict"] == "pass"


def test_quality_tolerances_must_be_positive():
    with pytest.raises(PerflabError, match="--quality-loss-rtol must be a positive number"):
        RunConfig(quality_loss_rtol=0.0).validate()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_gate_passes_cuda_graphs_on_the_mlp(mode):
    cfg = resolve_config(RunConfig(workload="mlp", device="cuda", mode=mode, cuda_graphs=True), None)
    quality = run_quality_gate(load_workload("mlp", cfg), cfg, torch.device("cuda", torch.cuda.current_device()))
    assert quality.verdict == "pass", quality.reason
    if mode == "train":  # the capture's warm-up iterations must not have trained the graphed model ahead
        assert quality.metrics.max_loss_rel_delta < 1e-3

"""The training gate's fp32 baseline kept between a tune's trials (perflab/quality/baseline_cache.py): the second
gated run with the same settings, weights and batches reads the baseline's losses instead of training it again; a
run with other settings does not."""
import json

import torch

from perflab.cli import main
from perflab.config import RunConfig
from perflab.quality import baseline_cache
from perflab.quality.baseline_cache import CACHE_ENV, baseline_settings, tensor_digest


def test_a_digest_tells_apart_order_values_and_dtypes_and_matches_equal_tensors():
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_digest([values]) == tensor_digest([values.clone()])
    assert tensor_digest([values]) != tensor_digest([values.flip(0)])  # same sum, another order
    assert tensor_digest([values]) != tensor_digest([values.double()])
    nudged = values.clone()
    nudged[1, 2] += 1e-3
    assert tensor_digest([values]) != tensor_digest([nudged])


def test_the_baseline_settings_leave_out_every_levers_option_and_the_timing_but_not_the_batch():
    cfg = RunConfig(workload="mlp", mode="train", batch_size=8, precision="bf16", channels_last=True, trials=5)
    plain = RunConfig(workload="mlp", mode="train", batch_size=8, trials=2, steps=3)
    assert baseline_settings(cfg) == baseline_settings(plain)
    assert baseline_settings(cfg) != baseline_settings(plain.replace(batch_size=16))


def gated_run(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["run", "--workload", "mlp", "--mode", "train", "--batch", "8", "--steps", "2", "--warmup", "1",
                 "--trials", "1", "--device", "cpu", "--precision", "bf16", "--quality-steps", "3", "--out", str(out),
                 *extra]) == 0
    return json.loads((out / "result.json").read_text())["quality"]


def test_a_second_gated_run_reads_the_baseline_an_earlier_one_stored_and_another_batch_trains_its_own(
        tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "baselines"))
    from perflab.quality import gate
    trained, real_observe = [], gate.observe

    def counting_observe(plan, inputs, cfg):
        trained.append(cfg.batch_size)
        return real_observe(plan, inputs, cfg)
    monkeypatch.setattr(gate, "observe", counting_observe)
    first = gated_run(tmp_path, "first")
    assert trained == [8, 8] and "earlier trial" not in first["baseline"]  # the baseline and its nudged twin
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 1
    second = gated_run(tmp_path, "second", "--trials", "2")  # a confirmation sized otherwise: the same baseline
    assert trained == [8, 8] and second["baseline"].endswith("(same settings, weights and batches)")
    assert second["tolerances"]["noise_floor"] == first["tolerances"]["noise_floor"]
    third = gated_run(tmp_path, "third", "--batch", "4")
    assert trained == [8, 8, 4, 4] and "earlier trial" not in third["baseline"]


def test_without_the_cache_folder_every_gate_trains_its_baseline(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert baseline_cache.cache_folder() is None
    first, second = gated_run(tmp_path, "a"), gated_run(tmp_path, "b")
    assert "earlier trial" not in first["baseline"] + second["baseline"]


def test_every_trial_of_a_tune_shares_one_baseline_folder_in_the_tune_directory(tmp_path):
    from perflab.tune.trial import GATE_BASELINES_DIR, compile_cache_dir, compile_cache_env
    out = tmp_path / "tune" / "trials" / "03-bf16"
    env = compile_cache_env(compile_cache_dir(out), environ={})
    assert env[CACHE_ENV] == str(tmp_path / "tune" / GATE_BASELINES_DIR)

"""perflab memory: one step's peak by category sums to the measured peak; the peak fitted over batch; the largest
batch found by probes in their own processes under a fake memory limit; what each lever frees."""
import json
from pathlib import Path

import pytest
import torch

from perflab.backends import bf16_is_native, cpu_capability
from perflab.cli import main
from perflab.config import RunConfig
from perflab.diagnose.activation_memory import activation_memory
from perflab.diagnose.findings import Context
from perflab.memory import step as step_module
from perflab.memory.breakdown import AutocastStep, Breakdown
from perflab.memory.fit import fit_peaks
from perflab.memory.levers import lever_savings
from perflab.memory.search import Probe, find_largest_batch, probe_in_process
from perflab.memory.step import measure_step
from perflab.memory.timeline import CATEGORIES
from perflab.results import Result

ROOT = Path(__file__).resolve().parents[1]
HEAVY = str(ROOT / "tests/planted/activation_heavy.py") + ":build"
CONV = str(ROOT / "tests/planted/conv_bias_bn.py") + ":build"


def model_bytes_mb(cfg: RunConfig) -> float:
    from perflab.pipeline import load
    return sum(p.numel() * p.element_size() for p in load(None, cfg).model.parameters()) / 2**20


@pytest.mark.parametrize("workload,batch", [("transformer", 4), (HEAVY, 32)])
def test_the_breakdown_sums_to_the_measured_peak_within_5_percent(workload, batch):
    cfg = RunConfig(workload=workload, batch_size=batch, device="cpu")
    breakdown = measure_step(cfg)
    assert "torch.profiler memory timeline" in breakdown.source
    assert breakdown.peak_mb > 0
    assert abs(breakdown.unattributed_mb) <= 0.05 * breakdown.peak_mb
    assert breakdown.categories_mb["parameters"] == pytest.approx(model_bytes_mb(cfg), rel=0.05)
    assert breakdown.activations.total_mb > 0 and breakdown.largest_module() is not None
    timeline = breakdown.category_timeline()
    assert max(timeline.totals()) == pytest.approx(breakdown.attributed_mb)


def test_without_the_profilers_memory_profile_perflab_counts_itself(monkeypatch):
    monkeypatch.setattr(step_module, "category_timeline", lambda prof, device: (None, "not here"))
    cfg = RunConfig(workload=HEAVY, batch_size=256, device="cpu")  # activations outweigh the gradients
    breakdown = measure_step(cfg)
    assert breakdown.source.startswith("perflab's own accounting") and breakdown.timeline is None
    assert breakdown.categories_mb["parameters"] == pytest.approx(model_bytes_mb(cfg), rel=0.01)
    assert breakdown.categories_mb["activations"] > 0
    assert abs(breakdown.unattributed_mb) <= 0.05 * breakdown.peak_mb


def test_the_search_grows_then_bisects_to_the_largest_batch_under_the_limit():
    peak = lambda batch: 10.0 + 2.0 * batch  # noqa: E731  (limit 100 MiB: batch 45 fits, 46 does not)
    ran = []

    def probe(batch):
        ran.append(batch)
        return Probe(batch, "ok", peak(batch)) if peak(batch) <= 100 else Probe(batch, "oom")
    search = find_largest_batch(probe, start=8, known_fits=4)
    assert ran[:3] == [8, 16, 32] and ran[3] == 64  # doubling until the first out-of-memory
    assert search.largest_fits == 45 and search.smallest_oom == 46
    assert search.largest_peak_mb == peak(45)


def test_probes_run_in_their_own_processes_under_a_fake_memory_limit():
    cfg = RunConfig(workload=HEAVY, batch_size=16, device="cpu")
    small, large = measure_step(cfg).peak_mb, measure_step(cfg.replace(batch_size=64)).peak_mb
    fit = fit_peaks([16, 64], [small, large])
    limit = fit.predict_mb(128)
    search = find_largest_batch(lambda batch: probe_in_process(cfg, batch, limit), start=96, known_fits=64,
                                growth=2.0, tolerance=0.5)  # three probes, each its own process
    statuses = {probe.batch: probe.status for probe in search.probes}
    assert statuses[96] == "ok" and statuses[192] == "oom" and 144 in statuses  # grown, then bisected
    assert all(p.peak_mb <= limit for p in search.probes if p.status == "ok")
    assert 96 <= search.largest_fits < search.smallest_oom <= 192


def synthetic_breakdown(**changes) -> Breakdown:
    timeline = {"times_ms": [0.0, 1.0, 2.0],
                "mb": {"parameters": [100.0] * 3, "gradients": [0.0, 0.0, 100.0], "optimizer_state": [200.0] * 3,
                       "activations": [0.0, 400.0, 100.0], "inputs": [10.0] * 3, "temporaries": [0.0, 90.0, 0.0]}}
    fields = dict(workload="w", mode="train", device="cuda:0", batch_size=10, precision="fp32", peak_mb=800.0,
                  optimizer="AdamW",
                  peak_source="test", categories_mb={"parameters": 100.0, "gradients": 0.0, "optimizer_state": 200.0,
                                                     "activations": 400.0, "inputs": 10.0, "temporaries": 90.0},
                  source="test", reserved_mb=1000.0, total_mb=2000.0, timeline=timeline,
                  activations={"total_mb": 400.0, "by_module_mb": {"blocks.0": 200.0}, "blocks": "blocks",
                               "block_saved_mb": [100.0] * 4, "block_input_mb": [10.0] * 4})
    return Breakdown(**{**fields, **changes})


def test_each_lever_frees_what_the_breakdown_says_and_allows_a_larger_batch():
    breakdown = synthetic_breakdown()
    fit = fit_peaks([5, 10], [550.0, 800.0])  # 300 MiB fixed + 50 MiB per sample
    levers = {lever.lever: lever for lever in lever_savings(breakdown, fit, capacity_mb=1300.0, shards=4)}
    # checkpointing keeps 4 block inputs (40) of the 400 MiB, and the block recomputed in backward (100) beyond the
    # 90 MiB of temporaries at the peak, freed before it (10): activations x 0.125
    assert levers["activation checkpointing"].frees_mb == pytest.approx(400 - 40 - 10)
    # bf16 autocast halves activations and temporaries at the peak, and keeps bf16 copies of the weights (+50)
    assert levers["bf16 autocast"].frees_mb == pytest.approx(200 + 45 - 50)
    # torchao's 8-bit Adam: a byte per value and an fp32 scale per block of 256 instead of 4 bytes
    assert levers["8-bit optimizer state"].frees_mb == pytest.approx(200 * (1 - (1 + 4 / 256) / 4))
    assert levers["FSDP over 4 GPUs"].frees_mb == pytest.approx(300 * 0.75)
    assert levers["expandable_segments"].frees_mb == pytest.approx(200)  # reserved 1000 - allocated 800
    assert fit.largest_batch(1300.0) == 20
    assert all(lever.batch_allowed > 20 for lever in levers.values() if lever.batch_allowed is not None)
    # at a larger batch: the per-sample part scaled as the growing categories are where highest (activations 400,
    # inputs 10, temporaries 90 -> 200 + 10 + 45 of 500), the weight copies on the fixed part
    bf16 = levers["bf16 autocast"]
    assert bf16.per_sample_mb == pytest.approx(50 * 255 / 500) and bf16.fixed_mb == pytest.approx(300 + 50)
    assert fit.predict_mb(40) - bf16.predict_mb(40) == pytest.approx(2300 - (350 + 40 * 25.5))


@pytest.mark.cpu_isa
@pytest.mark.parametrize("workload,batch,workload_options", [(HEAVY, 512, {"size": 128}), (CONV, 64, {})])
def test_the_bf16_autocast_saving_is_this_cpus_within_10_percent_of_the_measured_one(workload, batch,
                                                                                    workload_options):
    """Where the CPU has bf16 instructions the saving is predicted from one forward under autocast and is a real
    saving; where it emulates bf16 (AVX2), the saving is measured from a step under autocast and says why."""
    cfg = RunConfig(workload=workload, batch_size=batch, device="cpu", workload_options=workload_options)
    full = measure_step(cfg)
    under = full.autocast_activations  # one forward under bf16 autocast, counted by dtype
    assert under.by_dtype_mb["bfloat16"] > 0 and under.parameter_copies_mb > 0
    predicted = {lever.lever: lever for lever in lever_savings(full, None, None)}["bf16 autocast"]
    bf16_peak_mb = measure_step(cfg.replace(precision="bf16")).peak_mb
    if bf16_is_native(torch.device("cpu")):
        assert "counted in one forward under bf16 autocast" in predicted.basis and not full.autocast_step
        measured = full.peak_mb - bf16_peak_mb
        assert measured > 0.2 * full.peak_mb
        assert predicted.frees_mb == pytest.approx(measured, rel=0.10)
    else:  # the saving is a measured one: the same step measured again agrees within the CPU peak's own noise
        assert predicted.basis.startswith("measured: one step under bf16 autocast")
        assert "bf16 is not native here" in predicted.basis and cpu_capability() in predicted.basis
        assert predicted.predicted_peak_mb == pytest.approx(bf16_peak_mb, rel=0.05)


def test_an_emulated_bf16_saving_comes_from_the_measured_step_with_its_grown_temporaries():
    breakdown = synthetic_breakdown()
    breakdown.autocast_step = AutocastStep(peak_mb=900.0, why="bf16 is not native here (cpu, AVX2: ...)",
                                           categories_mb={**breakdown.categories_mb, "activations": 200.0,
                                                          "temporaries": 135.0})
    saving = {lever.lever: lever for lever in lever_savings(breakdown, None, None)}["bf16 autocast"]
    assert saving.predicted_peak_mb == 900.0 and saving.frees_mb == pytest.approx(breakdown.peak_mb - 900.0)
    assert "activations x 0.50, temporaries x 1.50" in saving.basis and "AVX2" in saving.basis


def test_the_8bit_optimizer_state_is_a_byte_a_value_plus_a_scale_a_block_and_small_tensors_stay_fp32():
    from perflab.levers.optimizer import eight_bit_state_bytes

    assert eight_bit_state_bytes(4096) == 4096 + 16 * 4  # 16 blocks of 256, one fp32 scale each
    assert eight_bit_state_bytes(1 << 20) / (4 << 20) == pytest.approx(0.2539, abs=1e-4)
    assert eight_bit_state_bytes(1000) == 4000 and eight_bit_state_bytes(4096 + 100) == 4 * 4196  # stay fp32
    cfg = RunConfig(workload="transformer", batch_size=2, device="cpu")  # AdamW, biases and norms under 4096 values
    breakdown = measure_step(cfg, categorise=False)
    assert 0.2539 < breakdown.optimizer_state_8bit_share < 0.4
    saving = {lever.lever: lever for lever in lever_savings(breakdown, None, None)}["8-bit optimizer state"]
    assert saving.how == "--optimizer-impl 8bit"
    assert saving.frees_mb == pytest.approx(breakdown.categories_mb["optimizer_state"]
                                            * (1 - breakdown.optimizer_state_8bit_share), rel=0.05)


def test_the_8bit_optimizer_lever_refuses_without_torchao_and_replaces_only_adam(monkeypatch):
    import importlib.util

    from perflab.errors import PerflabError
    from perflab.levers import all_levers
    from perflab.levers.optimizer import eight_bit_optimizer

    lever = next(lever for lever in all_levers() if lever.name == "8bit-optimizer")
    assert lever.flag == "--optimizer-impl 8bit" and lever.changes_numerics and not lever.needs_cuda
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    assert "pip install torchao" in lever.refusal(RunConfig(optimizer_impl="8bit"), None, torch.device("cpu"))
    with pytest.raises(PerflabError, match="replaces Adam or AdamW"):
        eight_bit_optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))


def test_perflab_memory_writes_the_breakdown_the_fit_and_the_report(tmp_path, capsys):
    out = tmp_path / "memory"
    assert main(["memory", "--workload", HEAVY, "--batch", "32", "--out", str(out)]) == 0
    study = json.loads((out / "memory.json").read_text())
    assert set(study["breakdown"]["categories_mb"]) == set(CATEGORIES)
    assert sorted(study["fit"]["batches"]) == [8, 16, 32]
    assert study["peak_model"] == study["fit"]["model"] == "categories"  # every fit point categorised (profiler)
    assert study["fit"]["model_states_mb"] > 0 and len(study["fit"]["measured_mb"]) == 3
    assert study["raw_fit"]["model"] == "max_memory_allocated" and sorted(study["raw_fit"]["batches"]) == [8, 16, 32]
    assert {lever["lever"] for lever in study["levers"]} >= {"activation checkpointing", "bf16 autocast"}
    html = (out / "report.html").read_text()
    assert "data:image/png;base64" in html and "What each lever would free" in html
    printed = capsys.readouterr().out
    assert "measured peak" in printed and "largest activations" in printed


def test_the_activation_memory_finding_uses_the_saved_breakdown(tmp_path):
    study = {"breakdown": synthetic_breakdown().to_dict(),
             "levers": [lever.to_dict() for lever in lever_savings(synthetic_breakdown(), None, 1300.0)]}
    (tmp_path / "memory.json").write_text(json.dumps(study))
    result = Result(config={"precision": "fp32", "device": "cuda"}, environment={}, workload={}, trials=[],
                    metrics={}, status="oom", status_reason="out of memory at batch 64",
                    out_of_memory={"reserved_mb": 1900.0, "total_mb": 2000.0})
    result.path = str(tmp_path / "result.json")
    finding = activation_memory(Context(trace=None, profile=None, result=result))
    assert finding.confidence == 1.0 and "activations are 50% of the 800 MiB peak" in finding.summary
    assert "blocks.0" in finding.summary
    assert finding.advice[0].startswith("bf16 weights (model.to(torch.bfloat16)) frees 395 MiB")  # most first
    assert finding.advice[1].startswith("activation checkpointing (--activation-checkpointing) frees 350 MiB")
    assert finding.advice[2].startswith("FSDP over 8 GPUs (--nproc 8 --parallel fsdp) frees 262 MiB")
    assert finding.levers[:2] == ["activation-checkpointing", "bf16"]


H100_PEAKS = json.loads((ROOT / "tests/fixtures/h100_memory_peaks.json").read_text())["cases"]


@pytest.mark.parametrize("case", sorted(H100_PEAKS))
def test_the_category_model_predicts_the_h100_peak_at_the_largest_batch_within_5_percent(case):
    from perflab.memory.fit import CATEGORY_MODEL, category_fit

    recorded = H100_PEAKS[case]  # the breakdown's categories where the growing ones peaked, the probes' peaks
    categories = recorded["categories_at_growing_peak_mb"]
    breakdown = synthetic_breakdown(batch_size=recorded["batch_size"], peak_mb=recorded["peak_mb"],
                                    categories_mb=categories, timeline={"times_ms": [0.0],
                                                                        "mb": {k: [v] for k, v in categories.items()}})
    fit = category_fit([breakdown])
    assert fit.model == CATEGORY_MODEL
    largest = recorded["largest_fits"]
    measured = recorded["probes_ok"][str(largest)]
    assert fit.predict_mb(largest) == pytest.approx(measured, rel=0.05)
    raw = fit_peaks(recorded["raw_fit"]["batches"], recorded["raw_fit"]["peaks_mb"])  # the old model, as evidence
    assert case == "mlp_activation_heavy" or abs(raw.predict_mb(largest) / measured - 1) > 0.4


def test_the_category_model_fits_the_growing_categories_not_the_workspace():
    from perflab.memory.fit import category_fit

    def step(batch, workspace_mb):
        growing = 50.0 * batch
        return synthetic_breakdown(batch_size=batch, peak_mb=300 + growing + workspace_mb,
                                   categories_mb={"parameters": 100.0, "gradients": 0.0, "optimizer_state": 200.0,
                                                  "activations": growing, "inputs": 0.0, "temporaries": 0.0},
                                   timeline=None)
    steps = [step(2, 2000.0), step(4, 1000.0), step(8, 1500.0)]  # workspace that does not follow the batch
    fit = category_fit(steps)
    assert fit.fixed_mb == pytest.approx(300.0) and fit.per_sample_mb == pytest.approx(50.0)
    assert fit.measured_mb == [2400.0, 1500.0, 2200.0] and fit.batches == [2, 4, 8]


def test_activations_the_profiler_counted_as_temporaries_move_to_activations_so_checkpointing_sees_them():
    from perflab.memory.breakdown import count_saved_activations

    timeline = {"times_ms": [0.0, 1.0, 2.0],
                "mb": {"parameters": [100.0] * 3, "gradients": [0.0, 0.0, 100.0], "optimizer_state": [200.0] * 3,
                       "activations": [0.0] * 3, "inputs": [10.0] * 3, "temporaries": [0.0, 490.0, 100.0]}}
    breakdown = synthetic_breakdown(timeline=timeline, categories_mb={
        "parameters": 100.0, "gradients": 0.0, "optimizer_state": 200.0, "activations": 0.0, "inputs": 10.0,
        "temporaries": 490.0})
    count_saved_activations(breakdown)  # the hooks counted 400 MiB saved for backward
    assert breakdown.categories_mb["activations"] == 400.0 and breakdown.categories_mb["temporaries"] == 90.0
    assert breakdown.timeline.mb["activations"] == [0.0, 400.0, 100.0]
    fit = fit_peaks([5, 10], [550.0, 800.0])
    levers = {lever.lever: lever for lever in lever_savings(breakdown, fit, capacity_mb=1300.0)}
    # 4 block inputs (40), and the recomputed block (100) beyond the 90 MiB of temporaries at the peak (10)
    assert levers["activation checkpointing"].frees_mb == pytest.approx(400 - 40 - 10)


def test_the_batch_search_grows_past_a_start_beyond_its_old_cap_until_a_probe_runs_out_of_memory():
    from perflab.memory.search import Probe, find_largest_batch
    limit = 200_000  # on the H100 an MLP's search started at 121,030 and stopped there (the cap was 65,536)
    search = find_largest_batch(lambda batch: Probe(batch, "ok" if batch <= limit else "oom"), 121_030,
                                growth=1.1, tolerance=0.03)
    assert search.smallest_oom is not None and search.smallest_oom > limit
    assert limit * 0.97 <= search.largest_fits <= limit

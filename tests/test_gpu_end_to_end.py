"""CUDA-only end-to-end checks of paths CPU tests can only simulate: a real out-of-memory inside a sweep,
and the kernel-level comparison of two real GPU traces. Run on a GPU machine: `pytest -m cuda`."""
import pytest
import torch

from perflab.compare import compare_results
from perflab.config import RunConfig
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from perflab.sweep import run_sweep


@pytest.mark.cuda
def test_sweep_records_a_real_cuda_out_of_memory_and_goes_on(tmp_path):
    # A 1 GiB first layer cannot fit in 1% of the card; the points either side of it fit easily.
    torch.cuda.set_per_process_memory_fraction(0.01)
    try:
        configs = [RunConfig(workload="mlp", device="cuda", steps=3, trials=1, warmup=1, batch_size=64,
                             workload_options={"hidden": hidden}) for hidden in ("512", "262144", "1024")]
        summary = run_sweep(configs, tmp_path / "sweep", plots=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert [point.status for point in summary.rows] == ["ok", "oom", "ok"]
    assert "out of memory" in summary.rows[1].error.lower()


@pytest.mark.cuda
def test_compare_names_the_kernels_that_changed_between_two_gpu_traces(tmp_path):
    options = CaptureOptions(wait=1, warmup=1, active=2)
    results = []
    for precision in ("fp32", "bf16"):
        cfg = resolve_config(RunConfig(workload="resnet50", mode="infer", batch_size=32, steps=6, trials=1,
                                       warmup=2, precision=precision, check_quality=False), None)
        result, _, _ = profile_run("resnet50", cfg, tmp_path / precision, options)
        results.append(result)
    comparison = compare_results(*results)
    assert comparison.kernels, comparison.kernel_note
    assert "GPU time per profiled step" in comparison.kernel_note
    saved = -sum(row["delta_ms"] for row in comparison.kernels if row["delta_ms"] < 0)
    assert saved > 1.0, "bf16 should take at least 1 ms per step of kernel time off fp32 resnet50 at batch 32"

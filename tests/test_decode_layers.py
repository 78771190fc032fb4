"""Decode diagnosis per layer: weight products, kernels that read no weights, dequantisation and launch gaps, from a
(synthetic, kineto-format) trace of CUDA-graph decode steps."""
import pytest

from perflab.config import RunConfig
from perflab.diagnose.decode import KernelSpan, decode_kernels, decode_layer_costs
from perflab.diagnose.trace import load_trace
from tests.test_diagnose import _x, kernel, write_trace

# one layer of an int8 decode step: (kernel, µs). The products read weights; the copy widens int8 to bf16 first.
LAYER = [("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT", 20.0),   # qkv product (cuBLASLt)
         ("triton_poi_fused__to_copy_1", 5.0),                 # int8 -> bf16 in memory
         ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", 3.0),  # RMSNorm
         ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", 8.0)]    # attention over the KV cache
LAYERS, STEPS, GAP_US = 2, 3, 1.0


def decode_step_events(start: float, correlation: int) -> tuple[list[dict], float]:
    """One graph replay: one cudaGraphLaunch, its kernels 1 µs apart on the GPU."""
    events = [_x("cuda_runtime", "cudaGraphLaunch", start, 4, correlation=correlation)]
    t = start + 10
    for _ in range(LAYERS):
        for name, dur in LAYER:
            events.append(kernel(name, t, dur, correlation))
            t += dur + GAP_US
    return events, t


def synthetic_trace(tmp_path):
    events, corr, t = [], 1, 0.0
    for request in range(2):
        prefill_start = t
        events += [_x("cuda_runtime", "cudaLaunchKernel", t + 1, 4, correlation=999 + request),
                   kernel("sm90_xmma_gemm_bf16bf16_prefill", t + 10, 400, 999 + request)]  # not a decode step
        events.append(_x("user_annotation", "prefill", prefill_start, 420))
        t += 500
        decode_start = t
        for _ in range(STEPS):
            step, t = decode_step_events(t, corr)
            events += step
            corr += 1
        events.append(_x("user_annotation", "decode", decode_start, t - decode_start))
        t += 50
    return load_trace(write_trace(tmp_path / "decode.json", events))


def test_only_kernels_launched_inside_decode_ranges_count(tmp_path):
    kernels = decode_kernels(synthetic_trace(tmp_path))
    assert len(kernels) == 2 * STEPS * LAYERS * len(LAYER)
    assert not any("prefill" in k.name for k in kernels) and {k.request for k in kernels} == {0, 1}


def test_per_layer_costs_split_weight_products_dequantisation_other_kernels_and_gaps(tmp_path):
    kernels = decode_kernels(synthetic_trace(tmp_path))
    costs = decode_layer_costs(kernels, steps=2 * STEPS, layers=LAYERS, bound_ms_per_step=0.040)
    per_layer = costs.per_layer_us()
    assert per_layer["weight_kernels"] == pytest.approx(20.0)
    assert per_layer["dequantisation"] == pytest.approx(5.0)
    assert per_layer["non_weight_kernels"] == pytest.approx(11.0)  # norm 3 + attention 8 (its name holds "cutlass")
    # 1 µs between a step's kernels, 11 µs between steps (the next graph's kernels start 10 µs after its launch);
    # the prefill between the two decode phases is no gap
    per_phase = STEPS * (LAYERS * len(LAYER) - 1) * GAP_US + (STEPS - 1) * (10 + GAP_US)
    assert per_layer["launch_gaps"] == pytest.approx(2 * per_phase / (2 * STEPS) / LAYERS)
    assert per_layer["top_non_weight"]["fmha_cutlassF_bf16_aligned_64x64_rf_sm80"] == pytest.approx(8.0)
    what, us = costs.largest_cost()
    assert what == "kernels that read no weights" and us == pytest.approx(22.0)
    assert "kernels that read no weights" in costs.summary() and "% of the 0.04 ms bound" in costs.summary()


def test_gaps_are_idle_time_between_kernels_not_overlap():
    overlapping = [KernelSpan("gemv_a", 0.0, 10.0), KernelSpan("gemv_b", 5.0, 10.0), KernelSpan("norm", 20.0, 2.0)]
    costs = decode_layer_costs(overlapping, steps=1, layers=1)
    assert costs.gap_us == pytest.approx(5.0) and costs.step_us == pytest.approx(22.0)
    assert costs.weight_us == pytest.approx(20.0) and costs.other_us == pytest.approx(2.0)


def test_the_decode_regime_of_a_profiled_run_carries_the_per_layer_figures(tmp_path):
    from types import SimpleNamespace
    from perflab.diagnose.decode import decode_regime
    from perflab.diagnose.findings import Context
    from perflab.results.metrics import Generation, Metrics
    bound = {"pct_of_bound": 45.0, "measured_ms_per_token": 0.1, "bound_ms_per_token": 0.045,
             "measured_over_bound": 2.2, "memory_gbps": 3000.0, "memory_gbps_source": "test"}
    generation = Generation.from_dict({"bandwidth_bound": bound, "output_len_mean": STEPS + 1.0})
    result = SimpleNamespace(metrics=Metrics(generation=generation), levers=[], workload={"info": {"layers": LAYERS}},
                             config=RunConfig(device="cpu", batch_size=1))
    finding = decode_regime(Context(trace=synthetic_trace(tmp_path), profile=None, result=result))
    per_layer = finding.evidence["per_layer_us"]
    assert per_layer["weight_kernels"] == pytest.approx(20.0) and per_layer["dequantisation"] == pytest.approx(5.0)
    assert finding.advice[0].startswith("per layer, 6 traced decode steps")

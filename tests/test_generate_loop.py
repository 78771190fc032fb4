"""The loop path: a workload's own generation loop (generate_fn) timed whole, its figures from two calls per request
batch, what it refuses, and the finding of what the loop adds per token over the model's step."""
import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import perflab
from perflab.cli import main
from perflab.config import RunConfig
from perflab.bottlenecks import LAUNCH_OVERHEAD
from perflab.diagnose.decode import classify_decode
from perflab.diagnose.generation_loop import (MEASURABLE_PCT, loop_overhead, loop_overhead_between,
                                              loop_overhead_finding)
from perflab.compare import compare_results
from perflab.generation import causal_lm_workload
from perflab.generation.loop_timing import LoopSample, config_kv_bytes_per_position, summarize_loop
from perflab.results.metrics import BandwidthBoundSummary, Generation, Latency

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64
SETUP_MS, PER_TOKEN_MS = 6.0, 4.0  # the fake loop's cost: a fixed part per call, then this much per token


class EchoLM(nn.Module):
    """The smallest causal LM with the transformers calling convention (the step path and the gate need one)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        return {"logits": self.head(self.embed(input_ids)), "past_key_values": None}


def sleeping_loop(input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """A generation loop whose cost is known: SETUP_MS per call, PER_TOKEN_MS per token made."""
    time.sleep((SETUP_MS + PER_TOKEN_MS * max_new_tokens) / 1e3)
    return torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], max_new_tokens)], dim=1)


def loop_config(tmp_path, **changes) -> perflab.RunConfig:
    settings = dict(mode="infer", device="cpu", batch_size=2, steps=4, trials=2, warmup=1,
                    workload_options={"prompt_len": "5", "output_len": "6"}, out=str(tmp_path / "run"))
    return perflab.RunConfig(**{**settings, **changes})


def loop_workload(cfg, generate_fn=sleeping_loop) -> perflab.Workload:
    torch.manual_seed(0)
    return causal_lm_workload(EchoLM(), VOCAB, cfg, name="echo", generate_fn=generate_fn)


# ---------------------------------------------------------------------------------------------- the arithmetic

def test_ttft_tpot_and_tokens_per_s_come_from_a_one_token_call_and_a_whole_call():
    # a batch of 4, 9 tokens: the one-token call took 12 ms, the whole call 12 + 8 x 2.5 ms
    samples = [LoopSample(batch=4, prompt_len=16, new_tokens=9, first_token_ms=12.0, whole_ms=32.0)] * 3
    generation = summarize_loop(samples, steps_per_trial=[2, 1], bound=None, slo={})
    assert generation.timed_path == "loop" and generation.itl_ms is None
    assert generation.ttft_ms.p50 == pytest.approx(12.0)
    assert generation.tpot_ms.p50 == pytest.approx((32.0 - 12.0) / 8)
    assert generation.e2e_latency_ms.p50 == pytest.approx(32.0)
    # tokens/s over the whole calls' own time, not the one-token calls made to time the first token
    assert generation.output_tokens_per_s == pytest.approx(4 * 9 / 0.032)
    assert generation.output_tokens == 3 * 4 * 9 and generation.request_batches == 3


def test_the_per_token_time_of_a_loop_with_a_known_cost_per_token_is_that_cost(tmp_path):
    cfg = loop_config(tmp_path)
    result = perflab.run(loop_workload(cfg), cfg)
    generation = result.metrics.generation
    assert generation.timed_path == "loop" and generation.request_batches == 2 * 4  # the warm-up's calls left out
    assert generation.tpot_ms.p50 == pytest.approx(PER_TOKEN_MS, rel=0.15)
    assert generation.ttft_ms.p50 == pytest.approx(SETUP_MS + PER_TOKEN_MS, rel=0.15)
    assert generation.e2e_latency_ms.p50 == pytest.approx(SETUP_MS + 6 * PER_TOKEN_MS, rel=0.15)
    assert generation.itl_ms is None and generation.decode_regime is None  # the regime is the step path's to judge
    assert {"generate", "first_token"} <= set(result.metrics.phases_ms)
    assert "(N - 1)" in result.timing["generation"]


def test_a_loop_that_stops_early_is_refused_with_what_to_do(tmp_path):
    def stops_after_two(input_ids, max_new_tokens):
        return sleeping_loop(input_ids, min(max_new_tokens, 2))
    cfg = loop_config(tmp_path, warmup=0)
    with pytest.raises(perflab.PerflabError, match="min_new_tokens=max_new_tokens"):
        perflab.run(loop_workload(cfg, stops_after_two), cfg)


def test_a_loop_asked_for_one_token_per_request_is_refused(tmp_path):
    cfg = loop_config(tmp_path, workload_options={"prompt_len": "5", "output_len": "1-3"})
    with pytest.raises(perflab.PerflabError, match="output_len=2 or more"):
        perflab.run(loop_workload(cfg), cfg)


@pytest.mark.parametrize("changes", [{"kv_cache": "static"}, {"speculative": 2}, {"compile": "default", "warmup": 2}],
                         ids=["static-cache", "speculative", "compile"])
def test_perflabs_decode_loop_levers_are_refused_for_a_loop_of_ones_own(tmp_path, changes):
    cfg = loop_config(tmp_path, **changes)
    with pytest.raises(perflab.PerflabError, match="times its own generation loop"):
        perflab.run(loop_workload(cfg), cfg)


def test_serve_refuses_a_loop_of_ones_own_with_what_to_do(tmp_path):
    from perflab.serve.generation import check_generation_serving
    with pytest.raises(perflab.PerflabError, match="build the workload without generate_fn to serve it"):
        check_generation_serving(loop_workload(loop_config(tmp_path)), instances=1)


def test_kv_bytes_of_a_loops_cache_come_from_a_transformers_style_config():
    model = nn.Linear(2, 2)
    model.config = type("Config", (), {"num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                       "hidden_size": 2048})()
    # keys + values x 16 layers x batch 4 x 8 key/value heads x head dim 64 x 2 bytes
    assert config_kv_bytes_per_position(model, 4, torch.bfloat16) == 2 * 16 * 4 * 8 * 64 * 2
    assert config_kv_bytes_per_position(nn.Linear(2, 2), 4, torch.bfloat16) is None


# ---------------------------------------------------------------------------------------------- the finding

def generation(path: str, ms_per_token: float) -> Generation:
    return Generation(timed_path=path, tpot_ms=Latency(mean=ms_per_token, p50=ms_per_token),
                      bandwidth_bound=BandwidthBoundSummary(measured_ms_per_token=ms_per_token))


def test_the_loops_own_work_per_token_is_the_difference_of_the_two_paths():
    step, loop = generation("step", 7.09), generation("loop", 8.10)
    overhead = loop_overhead(step, loop)
    assert overhead.ms_per_token == pytest.approx(1.01) and overhead.pct_of_step == pytest.approx(101 / 7.09)
    finding = loop_overhead_finding(step, loop)
    assert finding.cls == LAUNCH_OVERHEAD and finding.levers == []
    assert finding.evidence["loop_overhead_ms_per_token"] == pytest.approx(1.01)
    assert "1.01 ms per token (14.2% of the step)" in finding.summary
    assert loop_overhead_between(loop, step).summary == finding.summary  # either order
    assert loop_overhead_between(step, generation("step", 8.1)) is None  # two step runs: nothing to say


def test_a_loop_within_the_noise_of_the_step_is_no_finding():
    step = generation("step", 10.0)
    assert loop_overhead_finding(step, generation("loop", 10.0 * (1 + MEASURABLE_PCT / 100) - 1e-6)) is None
    assert loop_overhead_finding(step, generation("loop", 10.0 * (1 + MEASURABLE_PCT / 100) + 1e-3)) is not None


def test_the_decode_regime_is_not_judged_on_a_loop_timed_whole():
    bound = BandwidthBoundSummary(pct_of_bound=20.0, measured_ms_per_token=5.0, bound_ms_per_token=1.0,
                                  measured_over_bound=5.0, memory_gbps=1000.0)
    assert classify_decode(Generation(timed_path="step", bandwidth_bound=bound), RunConfig(), None) is not None
    assert classify_decode(Generation(timed_path="loop", bandwidth_bound=bound), RunConfig(), None) is None


def test_compare_of_a_step_run_and_a_loop_run_reports_the_loops_own_work(tmp_path):
    cfg = loop_config(tmp_path)
    loop = perflab.run(loop_workload(cfg), cfg)
    step_cfg = loop_config(tmp_path, out=str(tmp_path / "step"))
    torch.manual_seed(0)
    step = perflab.run(causal_lm_workload(EchoLM(), VOCAB, step_cfg, name="echo"), step_cfg)
    assert step.metrics.generation.timed_path == "step"
    comparison = compare_results(step, loop)
    # the echo model's step takes well under a millisecond; the sleeping loop 4 ms per token
    [finding] = comparison.findings
    assert finding["cls"] == LAUNCH_OVERHEAD and finding["evidence"]["loop_overhead_ms_per_token"] > 2.0


# ---------------------------------------------------------------------------------------------- transformers

def test_the_hf_llama_example_times_generate_itself_through_the_cli(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "loop"
    assert main(["run", "--workload", "examples/hf_llama.py", "--mode", "infer", "--batch", "2", "--steps", "2",
                 "--trials", "2", "--warmup", "1", "--option", "prompt_len=8", "--option", "output_len=4",
                 "--out", str(out)]) == 0
    generation = json.loads((out / "result.json").read_text())["metrics"]["generation"]
    assert generation["timed_path"] == "loop" and generation["output_tokens"] == 2 * 2 * 2 * 4
    assert generation["tpot_ms"]["p50"] > 0 and generation["ttft_ms"]["p50"] > 0
    assert generation["bandwidth_bound"]["kv_bytes_per_position"] == 2 * 2 * 2 * 2 * 16 * 4  # llama-tiny, fp32


def test_sync_per_token_with_generate_timed_whole_is_one_clear_line(capsys):
    pytest.importorskip("transformers")
    assert main(["run", "--workload", "examples/hf_llama.py", "--mode", "infer", "--steps", "1",
                 "--option", "sync_per_token=1"]) == 2
    error = capsys.readouterr().err.strip()
    assert "add --option loop=step" in error and len(error.splitlines()) == 1

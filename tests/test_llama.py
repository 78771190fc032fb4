"""The Llama-shaped decoder (grouped-query attention, RoPE, SwiGLU, RMSNorm) on the one Decoder/KV-cache/generation
path: RoPE and GQA against reference computations, static-cache decode against the full forward, transformers'
LlamaForCausalLM with the same weights (when transformers is importable), and the bandwidth bound by hand."""
import math

import pytest
import torch

from perflab.generation.decode import generate_greedy, teacher_forced_logits
from perflab.generation.metrics import BandwidthBound, RequestTiming, weight_bytes_per_step
from perflab.generation.session import open_session
from perflab.models import gpt
from perflab.models.decoder import SIZES, Decoder
from perflab.models.gpt import apply_rotary, attend, rotary_tables
from perflab.models.kv_cache import StaticKVCache, kv_cache_bytes

CPU = torch.device("cpu")
TINY = SIZES["llama-tiny"]


def llama_tiny(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(TINY).eval()


def test_rope_rotates_each_pair_as_a_complex_multiplication_by_its_position_angle():
    head_dim, theta, positions = 16, 500000.0, torch.tensor([0, 1, 7, 300])
    x = torch.randn(2, 3, len(positions), head_dim, dtype=torch.float64)
    cos, sin = rotary_tables(512, head_dim, theta)
    rotated = apply_rotary(x, cos[positions].double(), sin[positions].double())
    # reference: pair i is the complex number x[i] + j x[i + head_dim/2], turned by position x theta^(-2i/head_dim)
    half = head_dim // 2
    angles = positions[:, None].double() * theta ** (-2 * torch.arange(half, dtype=torch.float64) / head_dim)
    turned = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angles), angles)
    expected = torch.cat((turned.real, turned.imag), dim=-1)
    # the table is fp32 (as transformers'): an angle of 300 rad carries ~1e-5 of rounding
    torch.testing.assert_close(rotated, expected, rtol=1e-5, atol=5e-5)


def test_rope_makes_query_key_scores_depend_only_on_the_distance_between_positions():
    cos, sin = rotary_tables(64, 8, 10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        at = lambda t, p: apply_rotary(t, cos[p:p + 1], sin[p:p + 1])  # noqa: E731
        return float((at(q, m) * at(k, n)).sum())
    assert score(5, 2) == pytest.approx(score(40, 37), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def reference_attention(q, k, v, mask):
    """Softmax attention over key/value heads repeated for every query head that shares them."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


@pytest.mark.parametrize("repeat_fallback", [False, True], ids=["sdpa-gqa", "repeat-interleave (torch < 2.5)"])
@pytest.mark.parametrize("case", ["causal prefill", "one token", "masked extension"])
def test_grouped_query_attention_equals_attention_over_repeated_kv_heads(case, repeat_fallback, monkeypatch):
    monkeypatch.setattr(gpt, "SDPA_TAKES_GQA", gpt.SDPA_TAKES_GQA and not repeat_fallback)
    gen = torch.Generator().manual_seed(4)
    length, seen = {"causal prefill": (6, 6), "one token": (1, 9), "masked extension": (3, 10)}[case]
    q = torch.randn(2, 8, length, 16, generator=gen)
    k, v = (torch.randn(2, 2, seen, 16, generator=gen) for _ in range(2))
    if case == "masked extension":  # three new tokens at positions 5, 6, 7 of a 10-position static cache
        mask = (torch.arange(seen)[None, :] <= torch.arange(5, 8)[:, None]).view(1, 1, length, seen)
        given = mask
    else:
        mask = torch.ones(length, seen, dtype=torch.bool).tril(seen - length).view(1, 1, length, seen)
        given = None
    torch.testing.assert_close(attend(q, k, v, given), reference_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_static_cache_holds_only_the_key_value_heads():
    model = llama_tiny()
    model.attach_caches(static=True, batch=3, max_seq=40, dtype=torch.float32, device=CPU)
    cache = model.caches()[0]
    assert isinstance(cache, StaticKVCache)
    assert tuple(cache.kv.shape) == (2, 3, TINY.kv_heads, 40, TINY.head_dim) and TINY.kv_heads < TINY.heads


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_llama_decode_token_by_token_equals_the_full_forward_logits(static):
    model = llama_tiny()
    prompt = torch.randint(0, TINY.vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        session = open_session(model, 2, 25, CPU, torch.float32, static=static)
        tokens = generate_greedy(session, prompt, 14)
        cached = teacher_forced_logits(session, prompt, tokens)
        full = model(torch.cat([prompt, tokens], dim=1))[:, prompt.shape[1] - 1:-1]
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-5)
    assert torch.equal(full.argmax(-1), tokens)


def test_llama_decode_step_traces_as_one_graph_and_reads_nothing_back_per_token():
    from tests.test_decode_step import eager_backend_session, host_syncs
    model = llama_tiny()
    prompt = torch.randint(0, TINY.vocab, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = generate_greedy(open_session(model, 2, 48, CPU, torch.float32, static=True), prompt, 12)
        session = eager_backend_session(model, batch=2)  # fullgraph: a graph break would raise
        assert torch.equal(generate_greedy(session, prompt, 12), expected)
        assert host_syncs(lambda: generate_greedy(session, prompt, 12)) == 0
    torch._dynamo.reset()


def test_generate_runs_a_llama_size_through_the_cli_and_its_static_cache_passes_the_gate(tmp_path):
    import json
    from perflab.cli import main
    code = main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=llama-tiny", "--option",
                 "prompt_len=8", "--option", "output_len=6", "--batch", "2", "--kv-cache", "static",
                 "--quality-steps", "2", "--steps", "2", "--warmup", "1", "--trials", "1", "--out",
                 str(tmp_path / "run")])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert code == 0 and result["quality"]["verdict"] == "pass"
    assert result["workload"]["info"]["kv_heads"] == 2 and result["workload"]["info"]["family"] == "llama"
    # the bound's KV bytes: 2 x 2 layers x batch 2 x 2 kv heads x 16 dims x 4 bytes
    assert result["metrics"]["generation"]["bandwidth_bound"]["kv_bytes_per_position"] == 2 * 2 * 2 * 2 * 16 * 4


def test_llama_logits_equal_transformers_llama_with_the_same_weights():
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM
    from perflab.models.hf_llama import copy_into_hf_llama, llama_config
    ours = llama_tiny(3)
    theirs = copy_into_hf_llama(ours, LlamaForCausalLM(llama_config(TINY)).eval())
    tokens = torch.randint(0, TINY.vocab, (2, 17), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = theirs(input_ids=tokens).logits
        got = ours(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- the bound, by hand

def llama_8b_on_meta() -> Decoder:
    with torch.device("meta"):  # the shapes without 32 GB of weights
        return Decoder(SIZES["llama-8b"]).to(torch.bfloat16)


def test_llama_8b_step_reads_every_weight_once_and_one_embedding_row_per_sequence():
    # Llama-3-8B: 8,030,261,248 parameters; the untied head is read whole, the embedding table only where looked up
    embedding = 128256 * 4096
    assert sum(p.numel() for p in llama_8b_on_meta().parameters()) == 8_030_261_248
    for batch in (1, 8, 64):
        assert weight_bytes_per_step(llama_8b_on_meta(), batch) == 2 * (8_030_261_248 - embedding + batch * 4096)


def test_kv_bytes_count_the_eight_key_value_heads_not_the_thirty_two_query_heads():
    # keys + values x 32 layers x 8 kv heads x 128 dims x 2 bytes = 131,072 bytes per position per sequence
    assert kv_cache_bytes(32, 1, 8, 128, 1, torch.bfloat16) == 131_072
    assert kv_cache_bytes(32, 32, 8, 128, 1024, torch.bfloat16) == 32 * 1024 * 131_072  # 4.3 GB at batch 32


@pytest.mark.parametrize("batch", [1, 8, 32, 64])
def test_batched_decode_bound_adds_the_kv_reads_of_every_sequence_to_one_read_of_the_weights(batch):
    weights = weight_bytes_per_step(llama_8b_on_meta(), batch)
    bound = BandwidthBound(weights, kv_cache_bytes(32, batch, 8, 128, 1, torch.bfloat16), 3000.0, "test")
    # a request of prompt 1024 and 3 output tokens: decode steps at 1025 and 1026 cached positions
    request = RequestTiming(batch=batch, prompt_len=1024, emitted_ms=[1.0, 2.0, 3.0], counts=[1, 1, 1])
    step_1025 = 2 * (7_504_924_672 + batch * 4096) + batch * 1025 * 131_072
    step_1026 = step_1025 + batch * 131_072
    assert bound.decode_bound_ms(request) == pytest.approx((step_1025 + step_1026) / 3000e9 * 1e3)
    if batch == 8:  # 15.010 GB of weights + 1.075 GB of keys and values: 5.36 ms per step at 3 TB/s
        assert bound.decode_bound_ms(request) / 2 == pytest.approx(5.3616, abs=1e-3)
    if batch == 64:  # the KV reads (8.6 GB) are more than half the weights' (15.0 GB)
        assert batch * 1025 * 131_072 > 0.5 * weights


def test_the_transformers_llama_example_without_transformers_says_how_to_install_it(capsys):
    import importlib.util
    from perflab.cli import main
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here")
    assert main(["run", "--workload", "examples/hf_llama.py", "--mode", "infer", "--steps", "1"]) == 2
    assert "pip install 'perflab[models]'" in capsys.readouterr().err


def test_the_example_runs_transformers_llama_with_a_static_cache_to_the_same_greedy_tokens():
    pytest.importorskip("transformers")
    import importlib.util
    from pathlib import Path
    from transformers import LlamaForCausalLM
    from perflab.models.hf_llama import copy_into_hf_llama, llama_config
    spec = importlib.util.spec_from_file_location("hf_llama_example", Path(__file__).parents[1] / "examples" / "hf_llama.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ours = llama_tiny(6)
    runner = example.GenerateLikeLM(copy_into_hf_llama(ours, LlamaForCausalLM(llama_config(TINY)).eval()), 40)
    prompt = torch.randint(0, TINY.vocab, (2, 10), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        expected = generate_greedy(open_session(ours, 2, 40, CPU, torch.float32, static=True), prompt, 12)
        for _ in range(2):  # the second request reuses (resets) the first one's cache
            assert torch.equal(generate_greedy(open_session(runner, 2, 40, CPU, torch.float32), prompt, 12), expected)

"""Generation: KV-cache decoding, speculative decoding, request metrics, the bound, levers' refusals, end to end."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from perflab.cli import main
from perflab.models.language import trained_decoder
from perflab.generation.decode import generate_greedy
from perflab.models.decoder import DRAFT_SIZES, SIZES, Decoder, DecoderSize
from perflab.config import RunConfig, parse_slo
from perflab.generation.metrics import (BandwidthBound, RequestTiming, TokenClock, summarize_requests,
                                        weight_bytes_per_step)
from perflab.generation.session import open_session
from perflab.generation.speculative import SpeculativeStats, generate_speculative
from perflab.diagnose.decode import classify_decode
from perflab.bottlenecks import COMPUTE_BOUND, LAUNCH_OVERHEAD, MEMORY_BANDWIDTH
from perflab.errors import PerflabError
from perflab.results.metrics import Generation

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
FAST = ["--steps", "2", "--warmup", "1", "--trials", "2"]
TINY = ["--workload", "generate", "--mode", "infer", "--option", "size=tiny", "--option", "prompt_len=8-12",
        "--option", "output_len=6", "--quality-steps", "2"]


def example_module():
    spec = importlib.util.spec_from_file_location("my_causal_lm_for_tests", ROOT / "examples" / "my_causal_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_decoder(seed: int = 0, size: DecoderSize = SIZES["tiny"]) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(size).eval()


def recompute_greedy(model, prompt: torch.Tensor, new_tokens: int):
    """Greedy decoding without a cache: the whole sequence through the model at every step."""
    from perflab.models.outputs import output_field
    sequence, logits = prompt, []
    for _ in range(new_tokens):
        if isinstance(model, Decoder):
            out = model(sequence)
        else:
            out = output_field(model(input_ids=sequence, attention_mask=torch.ones_like(sequence)), "logits", 0)
        logits.append(out[:, -1])
        sequence = torch.cat([sequence, out[:, -1:].argmax(-1)], dim=1)
    return sequence[:, prompt.shape[1]:], torch.stack(logits, dim=1)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_kv_cache_decoding_equals_full_recompute(static):
    model = tiny_decoder()
    prompt = torch.randint(0, 512, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected_tokens, expected_logits = recompute_greedy(model, prompt, 12)
        session = open_session(model, 2, 22, CPU, torch.float32, static=static)
        tokens = generate_greedy(session, prompt, 12)
        from perflab.generation.decode import teacher_forced_logits
        logits = teacher_forced_logits(session, prompt, tokens)
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-5)


def test_kv_cache_of_a_transformers_convention_model_equals_full_recompute():
    model = example_module().TinyCausalLM().eval()
    prompt = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected, _ = recompute_greedy(model, prompt, 9)
        tokens = generate_greedy(open_session(model, 2, 16, CPU, torch.float32), prompt, 9)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_speculative_output_is_identical_to_plain_greedy_decoding(static):
    target, draft = tiny_decoder(0), tiny_decoder(5, DRAFT_SIZES["tiny"])
    prompt = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(3))
    stats = SpeculativeStats()
    with torch.inference_mode():
        plain = generate_greedy(open_session(target, 2, 40, CPU, torch.float32, static=static), prompt, 20)
        # the target itself as its own draft accepts everything: the all-accepted path must be exact too
        for proposer in (draft, tiny_decoder(0)):
            sessions = [open_session(m, 2, 40, CPU, torch.float32, static=static) for m in (target, proposer)]
            assert torch.equal(generate_speculative(*sessions, prompt, 20, k=4, stats=stats), plain)
            for session in sessions:
                session.close()
    assert stats.accepted > 0 and stats.rounds > 0


def test_request_accounting_ttft_tpot_itl_goodput_and_bound():
    plain = RequestTiming(batch=2, prompt_len=10, emitted_ms=[5.0, 7.0, 9.0, 11.0], counts=[1, 1, 1, 1])
    speculative = RequestTiming(batch=2, prompt_len=10, emitted_ms=[4.0, 10.0], counts=[1, 3])
    assert plain.ttft_ms == 5.0 and plain.tpot_ms == pytest.approx(2.0) and plain.inter_token_ms == [2.0] * 3
    assert speculative.tpot_ms == pytest.approx(2.0) and speculative.inter_token_ms == [2.0, 2.0, 2.0]
    # one decode step reads 1000 weight bytes + 100 bytes per cached position; at 1 GB/s that is 1 µs per kB
    bound = BandwidthBound(weight_bytes=1000, kv_bytes_per_position=100, memory_gbps=1.0, source="test")
    metrics = summarize_requests([plain, speculative], [(2, 0.5)], bound, parse_slo("ttft:4.5,tpot:3"))
    assert metrics["requests"] == 4 and metrics["output_tokens"] == 16
    assert metrics["ttft_ms"]["mean"] == pytest.approx(4.5) and metrics["tpot_ms"]["mean"] == pytest.approx(2.0)
    assert metrics["output_tokens_per_s"] == pytest.approx(16 / 0.5) and metrics["requests_per_s"] == pytest.approx(8)
    assert metrics["goodput"]["requests_meeting_slo_pct"] == pytest.approx(50.0)  # the speculative one: TTFT 4 ms
    assert metrics["goodput"]["goodput_requests_per_s"] == pytest.approx(4.0)
    # decode steps at 11, 12, 13 cached positions, twice: 6 steps, 6000 + 100 * 72 bytes = 13.2 µs over 12 ms
    result = metrics["bandwidth_bound"]
    assert result["bound_ms_per_token"] == pytest.approx(13_200 / 1e6 / 6)
    assert result["measured_ms_per_token"] == pytest.approx(2.0)
    assert result["pct_of_bound"] == pytest.approx(100 * 0.0132 / 12)


def test_token_clock_marks_the_prefill_token_and_every_decode_token():
    clock = TokenClock(CPU)
    with torch.inference_mode():
        generate_greedy(open_session(tiny_decoder(), 1, 20, CPU, torch.float32), torch.zeros(1, 5, dtype=torch.long),
                        7, clock)
    (timing,) = clock.timings()
    assert timing.counts == [1] * 7 and timing.prompt_len == 5 and timing.batch == 1
    assert timing.emitted_ms == sorted(timing.emitted_ms) and timing.ttft_ms > 0
    assert sum(timing.inter_token_ms) == pytest.approx(timing.emitted_ms[-1] - timing.emitted_ms[0])


def test_weight_bytes_count_the_tied_head_once_and_only_looked_up_position_rows():
    model = tiny_decoder()
    size = SIZES["tiny"]
    every = sum(p.numel() for p in model.parameters()) * 4
    position_table = size.max_seq * size.dim * 4
    assert weight_bytes_per_step(model, batch=3) == every - position_table + 3 * size.dim * 4


def test_decode_regime_names_launch_bandwidth_and_compute_bound_steps():
    def metrics(pct, compute_ms=None):
        measured = 1.0
        bound = {"pct_of_bound": pct, "measured_ms_per_token": measured, "bound_ms_per_token": measured * pct / 100,
                 "measured_over_bound": 100 / pct, "memory_gbps": 3000.0, "memory_gbps_source": "test",
                 "compute_ms_per_token": compute_ms}
        return Generation.from_dict({"bandwidth_bound": bound})
    launch = classify_decode(metrics(8), RunConfig(batch_size=1), None)
    assert launch.cls == LAUNCH_OVERHEAD and "compile" in launch.levers and "8% of the bound" in launch.summary
    bandwidth = classify_decode(metrics(75), RunConfig(batch_size=1, compile="reduce-overhead"), None,
                                active=["int8-weight"])
    assert bandwidth.cls == MEMORY_BANDWIDTH and "int8-weight" not in bandwidth.levers
    compute = classify_decode(metrics(40, compute_ms=0.8), RunConfig(batch_size=256, compile="default"), None)
    assert compute.cls == COMPUTE_BOUND
    assert classify_decode(Generation(), RunConfig(), None) is None


def test_trained_pair_is_made_once_then_read_from_the_cache(monkeypatch):
    monkeypatch.setattr("perflab.models.language.training_steps", lambda size, on_gpu: 3)
    target, made = trained_decoder("tiny", "target", SIZES["tiny"], CPU)
    again, cached = trained_decoder("tiny", "target", SIZES["tiny"], CPU)
    draft, _ = trained_decoder("tiny", "draft", DRAFT_SIZES["tiny"], CPU)
    assert made["source"] == "trained now" and cached["source"] == "cache" and Path(cached["path"]).is_file()
    assert torch.equal(target.head.weight, again.head.weight)
    assert draft.size.dim < target.size.dim and draft.size.vocab == target.size.vocab  # smaller, not a copy


def run_cli(*args):
    """perflab's CLI on `args`, where a later `--option KEY=...` replaces TINY's (perflab refuses a key given twice)."""
    return main(last_option_wins(list(args)))


def last_option_wins(args: list) -> list:
    keys = [value.partition("=")[0] for flag, value in zip(args, args[1:]) if flag == "--option"]
    kept, index = [], 0
    while index < len(args):
        if args[index] == "--option" and index + 1 < len(args):
            key = args[index + 1].partition("=")[0]
            keys.remove(key)
            if key not in keys:  # the last one given
                kept += args[index:index + 2]
            index += 2
            continue
        kept.append(args[index])
        index += 1
    return kept


def test_run_generate_tiny_end_to_end_reports_request_metrics_and_the_bound(tmp_path, monkeypatch):
    from perflab.calibrate import device_key
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "calibration.json").write_text(json.dumps({device_key(CPU): {
        "device": device_key(CPU), "tflops": {"fp32": 0.05}, "memory_gbps": 5.0, "measured_utc": "test"}}))
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(cache))
    out = tmp_path / "run"
    assert run_cli("run", *TINY, *FAST, "--slo", "ttft:1000,tpot:1000", "--out", str(out)) == 0
    data = json.loads((out / "result.json").read_text())
    generation = data["metrics"]["generation"]
    assert generation["request_batches"] == 4 and generation["output_tokens"] == 4 * 6
    assert {"prefill", "decode"} <= set(data["metrics"]["phases_ms"])
    assert 0 < generation["ttft_ms"]["p50"] <= generation["e2e_latency_ms"]["p50"]
    assert generation["tpot_ms"]["mean"] > 0 and {"p50", "p95", "p99"} <= set(generation["itl_ms"])
    bound = generation["bandwidth_bound"]
    assert bound["memory_gbps"] == 5.0 and bound["pct_of_bound"] > 0
    assert bound["measured_over_bound"] == pytest.approx(100 / bound["pct_of_bound"])
    assert generation["goodput"]["requests_meeting_slo_pct"] == 100.0
    assert generation["decode_regime"]["cls"] in (LAUNCH_OVERHEAD, MEMORY_BANDWIDTH, COMPUTE_BOUND)
    assert data["quality"] is None  # no lever changes numerics


def test_static_cache_and_speculative_levers_pass_the_gate_through_the_cli(tmp_path):
    out = tmp_path / "spec"
    draft = ROOT / "examples" / "my_causal_lm.py"
    assert run_cli("run", "--workload", f"{draft}:build", "--mode", "infer", "--batch", "2", *FAST,
                   "--quality-steps", "2", "--speculative", "3", "--draft", f"{draft}:build_draft",
                   "--out", str(out)) == 0
    data = json.loads((out / "result.json").read_text())
    assert data["quality"]["verdict"] == "pass" and data["quality"]["metrics"]["speculative_identical"]
    assert data["metrics"]["generation"]["speculative"]["rounds"] > 0
    out = tmp_path / "static"
    assert run_cli("run", *TINY, *FAST, "--kv-cache", "static", "--out", str(out)) == 0
    quality = json.loads((out / "result.json").read_text())["quality"]
    assert quality["verdict"] == "pass" and quality["metrics"]["greedy_decisive_flips"] == 0


def test_quantize_without_torchao_exits_2_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchao", None)  # importing it now fails, installed or not
    assert run_cli("run", *TINY, *FAST, "--quantize", "int8-weight") == 2
    error = capsys.readouterr().err.strip()
    assert "pip install 'perflab[quant]'" in error and len(error.splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--speculative", "0"], "--speculative must be a positive integer"),
    (["--draft", "x.py:build_draft"], "add --speculative K"),
    (["--slo", "ttft=5"], "--slo expects ttft:MS"),
    (["--compile", "--warmup", "2"], "add --kv-cache static"),
    (["--option", "size=huge"], "size must be one of"),
    (["--option", "prompt_len=9-3"], "ascending"),
    (["--option", "size=llama-8b", "--option", "weights=trained"], "trained weights exist for"),
    (["--option", "size=llama-tiny", "--speculative", "2"], "has no built-in draft"),
], ids=["k-zero", "draft-without-k", "bad-slo", "compile-needs-static", "unknown-size", "bad-range", "8b-untrainable",
        "llama-without-draft"])
def test_bad_generation_inputs_exit_2_with_one_clear_line(args, message, capsys):
    assert run_cli("run", *TINY, *FAST, *args) == 2
    assert message in capsys.readouterr().err


def test_a_draft_with_another_vocabulary_is_refused(tmp_path, capsys):
    draft = tmp_path / "draft.py"
    draft.write_text("from perflab.models.decoder import Decoder, DecoderSize\n"
                     "def build_draft(cfg):\n    return Decoder(DecoderSize(1, 32, 2, 300, 256))\n")
    assert run_cli("run", *TINY, *FAST, "--speculative", "2", "--draft", f"{draft}:build_draft") == 2
    assert "vocabulary of 300 tokens and the target 512" in capsys.readouterr().err


def test_unknown_quantization_scheme_and_misplaced_levers_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli("run", *TINY, "--quantize", "int3")
    assert exit_info.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err
    assert run_cli("run", "--workload", "mlp", "--mode", "infer", *FAST, "--kv-cache", "static") == 2
    assert "does not generate tokens" in capsys.readouterr().err
    assert run_cli("run", "--workload", "generate", "--option", "size=tiny", *FAST) == 2
    assert "--mode infer" in capsys.readouterr().err


@pytest.mark.cuda
def test_compiled_static_cache_decode_with_cuda_graphs_passes_the_gate_on_a_gpu(tmp_path):
    out = tmp_path / "graphs"
    assert run_cli("run", *TINY, "--steps", "2", "--warmup", "2", "--trials", "2", "--device", "cuda",
                   "--kv-cache", "static", "--compile", "reduce-overhead", "--speculative", "3",
                   "--draft", f"{ROOT / 'examples' / 'my_causal_lm.py'}:build_draft", "--out", str(out)) == 0
    data = json.loads((out / "result.json").read_text())
    assert data["quality"]["verdict"] == "pass"
    assert data["metrics"]["generation"]["bandwidth_bound"]["weight_bytes"] > 0


@pytest.mark.cuda
def test_int8_weight_quantization_through_torchao_on_a_gpu(tmp_path):
    pytest.importorskip("torchao")
    out = tmp_path / "int8"
    assert run_cli("run", *TINY, *FAST, "--device", "cuda", "--precision", "bf16", "--quantize", "int8-weight",
                   "--out", str(out)) == 0
    data = json.loads((out / "result.json").read_text())
    assert data["quality"]["verdict"] == "pass" and "int8-weight" in data["levers"]
    fp_bytes = sum(p.numel() for p in Decoder(SIZES["tiny"]).parameters()) * 2
    assert data["metrics"]["generation"]["bandwidth_bound"]["weight_bytes"] < fp_bytes


def test_a_cache_object_is_rolled_back_by_a_negative_count_as_transformers_5_requires():
    from perflab.generation.session import crop_past

    class Cache:  # transformers 5's DynamicCache.crop: a negative count of positions to remove, nothing else
        def __init__(self, length):
            self.length = length

        def get_seq_length(self):
            return self.length

        def crop(self, tokens_to_remove):
            if tokens_to_remove > 0:
                raise ValueError("Calling `crop` with a positive value is not supported")
            self.length += tokens_to_remove

    cache = Cache(28)
    assert crop_past(cache, 20) is cache and cache.length == 20
    assert crop_past(cache, 20).length == 20, "nothing to remove: left as is"

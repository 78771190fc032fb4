"""The peers' benchmark area (benchmarks/bench_generate_peers.py) without a GPU: the command lines it would run, the
model folder vLLM would load, the bound of a grid cell by hand, and the table's reasons for what did not run."""
import json

import pytest
import torch

from benchmarks import bench_generate_peers as peers

CELL = peers.Cell("llama-8b", 8)


def test_vllm_command_line_is_built_without_running_anything(tmp_path, monkeypatch):
    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail("the builder must not run the command"))
    folder = peers.vllm_config_dir("llama-8b", tmp_path)
    command = peers.peer_commands(CELL, folder, tmp_path, python="python3")["vllm"]
    assert command[:6] == ["python3", "-m", "vllm.entrypoints.cli.main", "bench", "latency", "--model"]
    flags = {flag: value for flag, value in zip(command, command[1:] + [""])
             if flag.startswith("--") and not value.startswith("--")}
    assert flags["--model"] == str(folder) and flags["--load-format"] == "dummy" and flags["--dtype"] == "bfloat16"
    assert (flags["--batch-size"], flags["--input-len"], flags["--output-len"]) == ("8", "128", "128")
    assert "--skip-tokenizer-init" in command and flags["--max-model-len"] == "256"


def test_vllm_model_folder_holds_the_llama_3_8b_config_and_no_weights(tmp_path):
    folder = peers.vllm_config_dir("llama-8b", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == (
        4096, 32, 32, 8, 14336, 128256)
    assert config["rope_theta"] == 500000.0 and config["tie_word_embeddings"] is False
    assert [p.name for p in folder.iterdir()] == ["config.json"]


def test_without_vllm_the_table_says_why_it_did_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    row = peers.run_vllm(CELL, tmp_path, bound_ms=5.0)
    assert row.tokens_per_s is None and "not importable" in row.quality and "64 MiB" in row.quality
    table = peers.format_table([row])
    assert table.splitlines()[-1].startswith("llama-8b | 8 | vllm | — | — | — |")


def test_bound_of_a_grid_cell_is_the_weights_once_plus_every_sequences_kv_reads():
    gbps = 3000.0
    weights = 2 * (8_030_261_248 - 128256 * 4096 + 8 * 4096)  # bf16; 8 embedding rows looked up
    # 127 decode steps attending to 129..255 positions; 131,072 KV bytes per position per sequence
    positions = sum(128 + i for i in range(1, 128))
    expected_ms = (127 * weights + 8 * 131_072 * positions) / (gbps * 1e9) * 1e3 / 127
    assert peers.bound_ms_per_step(CELL, gbps) == pytest.approx(expected_ms)
    assert peers.bound_ms_per_step(CELL, None) is None


# ---------------------------------------------------------------------------------------------- the hf rows

def perflab_result(path: str, tokens_per_s: float, ms_per_step: float):
    """What the rows read of a perflab Result: its generation record."""
    from types import SimpleNamespace
    from perflab.results.metrics import BandwidthBoundSummary, Generation, Latency
    generation = Generation(timed_path=path, output_tokens_per_s=tokens_per_s, tpot_ms=Latency(mean=ms_per_step),
                            bandwidth_bound=BandwidthBoundSummary(measured_ms_per_token=ms_per_step, pct_of_bound=70.0))
    return SimpleNamespace(metrics=SimpleNamespace(generation=generation), trials=[])


def reference_row(tokens_per_s: float = 121.4, ms_per_step: float = 8.10):
    return peers.Row(CELL, "hf generate", tokens_per_s, ms_per_step, 71.3, "transformers 5.17")


def test_hf_rows_say_whether_perflabs_timing_of_generate_agrees_and_what_generates_loop_adds():
    loop, step = perflab_result("loop", 120.0, 8.15), perflab_result("step", 138.9, 7.09)
    rows = peers.hf_rows(CELL, reference_row(), loop, step, sync=False)
    assert [row.system for row in rows] == ["hf generate", "hf via perflab", "hf step via perflab"]
    via = rows[1]
    assert (via.tokens_per_s, via.ms_per_step) == (120.0, 8.15)
    assert "tokens/s -1.2%, ms/step +0.6% vs hf generate: agrees (within 3%)" in via.quality
    assert "generate's own loop adds +1.060 ms per token (+15.0% of the step)" in rows[2].quality
    table = peers.format_table(rows).splitlines()
    assert table[3].startswith("llama-8b | 8 | hf via perflab | 120.0 | 8.150 | 70.0 |")


def test_the_loop_path_disagrees_when_either_figure_is_off_by_more_than_agree_pct():
    reference = reference_row(100.0, 10.0)
    inside = peers.Row(CELL, "hf via perflab", 100.0 * (1 + peers.AGREE_PCT / 100) - 0.01, 10.0)
    assert peers.agrees(reference, inside) is True
    assert peers.agrees(reference, peers.Row(CELL, "x", 100.0, 10.0 * (1 + peers.AGREE_PCT / 100) + 0.01)) is False
    assert peers.agrees(reference, peers.Row(CELL, "x", 114.4, 8.75)) is False  # the step path's +14.4% of issue 28
    assert peers.agrees(peers.Row(CELL, "hf generate", quality="failed"), inside) is None
    assert "no reference" in peers.agreement_note(peers.Row(CELL, "hf generate"), inside)


def test_a_path_that_did_not_run_keeps_its_reason_and_the_other_rows_stay():
    rows = peers.hf_rows(CELL, reference_row(), "failed: RuntimeError: boom", perflab_result("step", 138.9, 7.09),
                         sync=True)
    assert rows[1].tokens_per_s is None and rows[1].quality == "failed: RuntimeError: boom"
    assert rows[2].tokens_per_s == 138.9 and rows[2].quality.endswith("; waits per token as generate does")


def test_the_bench_times_generate_whole_for_one_row_and_the_step_for_the_other(tmp_path, monkeypatch):
    from torch import nn
    import perflab
    ran = {}
    monkeypatch.setattr(perflab, "run", lambda workload, cfg, command: ran.setdefault(command[-1], (workload, cfg)))
    example = peers.example_module()
    model = nn.Linear(4, 4)
    model.config = object()  # what the example's runner keeps of a transformers model
    cell = peers.Cell("llama-tiny", 2, 16, 8)
    peers.run_hf_through_perflab(example, model, tmp_path, cell, False, "generate")
    peers.run_hf_through_perflab(example, model, tmp_path, cell, False, "step")
    loop_workload, loop_cfg = ran["hf generate via perflab"]
    step_workload, step_cfg = ran["hf step via perflab"]
    assert loop_workload.generation.generate_fn is not None and loop_workload.model is model
    assert step_workload.generation.generate_fn is None and isinstance(step_workload.model, example.GenerateLikeLM)
    assert loop_cfg.batch_size == 2 and loop_cfg.workload_options == {"prompt_len": "16", "output_len": "8"}
    assert loop_cfg.out != step_cfg.out


def test_a_quantized_variant_is_a_scheme_with_tunings_graphs_or_attention_changes():
    from benchmarks.peers_quantized import parse_variant
    variant = parse_variant("int8-weight+torchao+inductor-graphs")
    assert variant.scheme == "int8-weight" and variant.name == "int8-weight+torchao+inductor-graphs"
    assert variant.options == {"decode_tuning": "torchao", "decode_graphs": "inductor"} and variant.settings == {}
    bf16 = parse_variant(" bf16+gpt-fast+sdpa-efficient")
    assert bf16.scheme is None and bf16.settings == {"sdpa": "efficient"} and bf16.options["decode_tuning"] == "gpt-fast"
    with pytest.raises(ValueError, match="changes are a decode tuning"):
        parse_variant("int8-weight+fast")
    with pytest.raises(ValueError, match="starts with one of bf16"):
        parse_variant("int3")


def test_the_diagnostic_preset_starts_with_the_bf16_reference_and_names_only_valid_variants():
    from benchmarks import peers_quantized
    for preset in peers_quantized.PRESETS:  # each starts with the bf16 reference its x-bf16 columns divide by
        parsed = peers_quantized.parse_variants(preset)
        assert parsed[0].name == "bf16" and "int8-weight" in {v.scheme for v in parsed}
    assert "int4-weight" in {v.scheme for v in peers_quantized.parse_variants("diagnostic")}
    assert [v.name for v in peers_quantized.parse_variants("bf16, int8-weight")] == ["bf16", "int8-weight"]
    assert "BENCH_PEERS_QUANT=diagnostic" in peers_quantized.__doc__


def test_the_gate_model_is_the_cells_random_shape_unless_named():
    from benchmarks.peers_quantized import parse_gate
    assert peers.__name__ and parse_gate("", CELL) == ("llama-8b", "random")
    assert parse_gate("none", CELL) is None
    assert parse_gate("llama-1b:trained", CELL) == ("llama-1b", "trained")
    with pytest.raises(ValueError, match="SHAPE:trained"):
        parse_gate("llama-1b:pretrained", CELL)


def test_the_table_gives_each_row_as_a_multiple_of_its_cells_bf16_row():
    quant = peers.Cell("llama-8b", 1)
    table = [peers.Row(quant, "perflab bf16", 200.0, 5.0, 79.5, ttft_ms=13.0),
             peers.Row(quant, "perflab int8-weight", 300.0, 2.5, 70.0, ttft_ms=33.0),
             peers.Row(CELL, "hf generate", 800.0, 9.0, 60.0)]
    lines = peers.format_table(table).splitlines()
    assert lines[0].endswith("TTFT ms | tokens/s x bf16 | step x bf16 | quality")
    assert "| 33.0 | 1.50x | 2.00x |" in lines[3]
    assert "| — | — | — |" in lines[4]  # no bf16 perflab row in that cell


def test_a_profiled_variant_reports_microseconds_per_layer_by_kind_of_kernel(tmp_path):
    from types import SimpleNamespace
    from benchmarks.peers_quantized import kernel_split
    from tests.test_decode_layers import LAYERS, synthetic_trace
    synthetic_trace(tmp_path)  # writes decode.json: 2 requests x 3 decode steps of 2 layers
    generation = SimpleNamespace(output_len_mean=4, bandwidth_bound=SimpleNamespace(bound_ms_per_token=0.04))
    result = SimpleNamespace(metrics=SimpleNamespace(generation=generation), workload={"info": {"layers": LAYERS}})
    split = kernel_split(tmp_path / "decode.json", result)
    assert split["weight_kernels"] == pytest.approx(20.0) and split["dequantisation"] == pytest.approx(5.0)
    assert split["bound"] == pytest.approx(20.0)
    text = peers.format_kernel_split([peers.Row(peers.Cell("llama-8b", 1), "perflab int8-weight", kernels=split)])
    assert text.splitlines()[-1].startswith("perflab int8-weight |") and "| 5.0 |" in text


def test_a_gemlite_variant_is_refused_with_the_reason_where_its_kernels_cannot_run(tmp_path):
    pytest.importorskip("torchao")
    from benchmarks.common import Rows
    from benchmarks.peers_quantized import parse_variant, run_variant
    variant = parse_variant("int8-weight+gemlite")
    assert variant.settings["quantize_kernel"] == "gemlite" and variant.scheme == "int8-weight"
    row = run_variant(Rows("t", tmp_path), tmp_path, peers.Cell("llama-tiny", 1, 8, 4), False, variant, profile=False)
    assert row.tokens_per_s is None
    assert row.quality == "not run: --quantize-kernel gemlite: gemlite's kernels are Triton kernels for a CUDA GPU"


def test_a_variant_names_its_quantized_kernel_and_bf16_takes_none():
    from benchmarks.peers_quantized import parse_variant
    assert parse_variant("int8-weight+torchao-kernel").settings == {"quantize_kernel": "torchao"}
    assert parse_variant("int8-weight").settings == {}  # perflab's default, auto
    with pytest.raises(ValueError, match="picks a quantized scheme's kernel"):
        parse_variant("bf16+gemlite")


def test_agreement_is_inconclusive_when_generates_own_calls_spread_wider_than_the_tolerance():
    """Measured on an H100 at llama-1b batch 1: generate's three calls 0.363-0.416 s (14%), the loop path +5.6%."""
    noisy = peers.Row(CELL, "hf generate", 323.3, 3.0, spread_pct=14.6)
    loop = peers.Row(CELL, "hf via perflab", 341.5, 2.818)
    assert peers.agrees(noisy, loop) is None
    assert "inconclusive: hf generate's own calls spread 15%" in peers.agreement_note(noisy, loop)
    steady = peers.Row(CELL, "hf generate", 323.3, 3.0, spread_pct=1.0)
    assert peers.agrees(steady, loop) is False


def test_agreement_is_inconclusive_when_perflabs_own_trials_spread_too(tmp_path):
    steady = peers.Row(CELL, "hf generate", 323.3, 3.0, spread_pct=1.0)
    noisy_loop = peers.Row(CELL, "hf via perflab", 341.5, 2.818, spread_pct=9.0)
    assert peers.agrees(steady, noisy_loop) is None
    assert "inconclusive: perflab's own trials spread 9%" in peers.agreement_note(steady, noisy_loop)


def test_a_perflab_runs_spread_is_read_from_its_trials():
    from types import SimpleNamespace
    trial = lambda value: SimpleNamespace(throughput_samples_per_s=value)  # noqa: E731
    assert peers.trials_spread_pct(SimpleNamespace(trials=[trial(100.0), trial(109.0), trial(104.0)])) == \
        pytest.approx(9.0)
    assert peers.trials_spread_pct(SimpleNamespace(trials=[trial(100.0)])) is None


def test_the_quantized_part_runs_at_the_8b_shape_at_batch_1_and_8_on_a_gpu_and_where_named(monkeypatch):
    for name in ("BENCH_PEERS_QUANT_SHAPE", "BENCH_PEERS_QUANT_BATCHES", "BENCH_PEERS_SHAPES", "BENCH_PEERS_BATCHES"):
        monkeypatch.delenv(name, raising=False)
    _, quant = peers.grid(full=True)
    assert [(c.shape, c.batch) for c in quant] == [("llama-8b", 1), ("llama-8b", 8)]
    monkeypatch.setenv("BENCH_PEERS_QUANT_SHAPE", "llama-1b")
    monkeypatch.setenv("BENCH_PEERS_QUANT_BATCHES", "1")
    assert [(c.shape, c.batch) for c in peers.grid(full=True)[1]] == [("llama-1b", 1)]
    monkeypatch.setenv("BENCH_PEERS_QUANT_SHAPE", "")
    assert peers.grid(full=True)[1] == []


def test_the_hf_torchao_peer_says_why_it_did_not_run_per_scheme_without_loading_anything(monkeypatch):
    import importlib.util
    from benchmarks import peers_hf_torchao
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    cells = [peers.Cell("llama-8b", 1), peers.Cell("llama-8b", 8)]
    rows = peers_hf_torchao.run_hf_torchao(None, cells, False, ["int8-weight", "int4-weight"], deadline=1e18, gbps=None)
    said = {(r.system, r.cell.batch): r.quality for r in rows}
    assert said[("hf generate + torchao int8-weight", 8)] == ("not run: transformers is not importable here: "
                                                             "pip install 'perflab[models]'")
    assert said[("hf generate + torchao int4-weight", 1)] == "not run: int4 in tinygemm's layout is CUDA-only"


def test_a_quantized_peers_bound_counts_the_bytes_its_model_stores():
    # a model holding half the bytes of the bf16 decoder (one weight in int8-sized storage) has a smaller bound
    from torch import nn
    cell = peers.Cell("llama-tiny", 1, prompt_len=16, output_len=8)
    full = peers.bound_ms_per_step(cell, 1000.0)
    from perflab.models.decoder import SIZES, Decoder
    model = Decoder(SIZES["llama-tiny"]).to(torch.bfloat16)
    assert peers.bound_ms_per_step(cell, 1000.0, model) == pytest.approx(full)
    model.head.weight = nn.Parameter(model.head.weight.detach().to(torch.int8), requires_grad=False)
    smaller = peers.bound_ms_per_step(cell, 1000.0, model)
    head_bytes = model.head.weight.numel()  # one byte each now, two before
    assert full - smaller == pytest.approx(head_bytes / 1000e9 * 1e3, rel=1e-6)


def test_an_hf_scheme_runs_in_its_own_process_and_a_stall_costs_only_its_own_rows(tmp_path, monkeypatch):
    # HF's first compiled generate of torchao's int8 once had not returned 145 s after loading: a scheme's process
    # is stopped at its limit and its rows say so, instead of the call's time limit cutting every row after it
    from benchmarks import peers_hf_torchao
    cells = [peers.Cell("llama-tiny", 1), peers.Cell("llama-tiny", 2)]
    rows = peers_hf_torchao.Rows("test", tmp_path)
    monkeypatch.setenv("BENCH_PEERS_QUANT_HF_LIMIT_S", "0.3")  # less than the child's own start
    stalled = peers_hf_torchao._hf_torchao_scheme(rows, tmp_path, cells, "int8-weight", torch.device("cpu"),
                                                 deadline=1e18, gbps=None, saved_s=1.0)
    assert [(r.cell.batch, r.quality) for r in stalled] == [
        (1, "not measured within 0 s (the limit of its own process: load, compile, warm-up)"),
        (2, "not measured within 0 s (the limit of its own process: load, compile, warm-up)")]
    monkeypatch.setenv("BENCH_PEERS_QUANT_HF_LIMIT_S", "120")  # the child finds no saved model here: it answers why
    failed = peers_hf_torchao._hf_torchao_scheme(rows, tmp_path, cells, "int8-weight", torch.device("cpu"),
                                                deadline=1e18, gbps=None, saved_s=1.0)
    assert len(failed) == 2 and all(r.tokens_per_s is None for r in failed)
    assert all(r.quality.startswith(("failed to load:", "not measured: its process ended first")) for r in failed)


def test_generate_timed_so_noisily_that_its_one_token_call_outlasts_the_whole_one_gives_no_step_time():
    timed = {"full_s": 0.10, "prefill_s": 0.12, "warm_s": 1.0, "full_calls_s": [0.1, 0.3], "tokens_per_s": 80.0,
             "ms_per_step": None}
    row = peers.generate_row(CELL, timed, bound_ms=5.0, transformers_version="5.17.0")
    assert row.ms_per_step is None and row.pct_of_bound is None and "too noisy to subtract" in row.quality

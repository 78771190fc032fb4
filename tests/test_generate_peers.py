"""The peers' benchmark area (benchmarks/bench_generate_peers.py) without a GPU: the command lines it would run, the
model folder vLLM would load, the bound of a grid cell by hand, and the table's reasons for what did not run."""
import json

import pytest

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
    assert variant.gemlite and variant.scheme == "int8-weight"
    with pytest.raises(ValueError, match="gemlite takes int4-weight, int8-weight"):
        parse_variant("bf16+gemlite")
    row = run_variant(Rows("t", tmp_path), tmp_path, peers.Cell("llama-tiny", 1, 8, 4), False, variant, profile=False)
    assert row.tokens_per_s is None and row.quality == "not run: gemlite's kernels are Triton kernels for a GPU"


def test_a_gemlite_variant_asks_torchao_for_its_gemlite_config_only_while_it_runs():
    pytest.importorskip("torchao")
    from benchmarks.peers_quantized import parse_variant, torchao_config_for
    from perflab.generation import quantize
    with torchao_config_for(parse_variant("int4-weight+gemlite")):
        config = quantize.quantization_config("int4-weight")
        assert (type(config).__name__, config.bit_width, config.group_size) == ("UIntxWeightOnlyConfig", 4, 128)
        assert config.set_inductor_config is False and quantize.quantization_config("int8-weight").bit_width == 8
    assert type(quantize.quantization_config("int4-weight")).__name__ == "Int4WeightOnlyConfig"

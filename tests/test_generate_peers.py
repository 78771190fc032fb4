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

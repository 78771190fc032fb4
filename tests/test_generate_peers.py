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


# ---------------------------------------------------------------------------------------------- the hf rows

def perflab_result(path: str, tokens_per_s: float, ms_per_step: float):
    """What the rows read of a perflab Result: its generation record."""
    from types import SimpleNamespace
    from perflab.results.metrics import BandwidthBoundSummary, Generation, Latency
    generation = Generation(timed_path=path, output_tokens_per_s=tokens_per_s, tpot_ms=Latency(mean=ms_per_step),
                            bandwidth_bound=BandwidthBoundSummary(measured_ms_per_token=ms_per_step, pct_of_bound=70.0))
    return SimpleNamespace(metrics=SimpleNamespace(generation=generation))


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

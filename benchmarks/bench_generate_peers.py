"""Area "generate_peers": decode at a real model's shape (Llama-3), perflab beside the engines people use, and
quantized decode through the generation quality gate.

    python -m benchmarks.bench_generate_peers --out DIR [--quick]
    BENCH_PEERS_SHAPES=llama-1b,llama-8b BENCH_PEERS_BATCHES=1,8,32,64 python -m benchmarks.bench_generate_peers ...
    BENCH_PEERS_SYSTEMS=perflab,hf BENCH_PEERS_QUANT=int8-weight python -m benchmarks.bench_generate_peers ...
    BENCH_PEERS_QUANT= ...        # the grid alone;  BENCH_PEERS_SYSTEMS=none ...: the quantized part alone
    BENCH_PEERS_QUANT=bf16,int8-weight+torchao,... BENCH_PEERS_QUANT_PROFILE=1 ...   # its variants, profiled
    BENCH_PEERS_SYSTEMS=none BENCH_PEERS_QUANT=diagnostic BENCH_PEERS_QUANT_PROFILE=1 ...  # issue 28's (peers_quantized.py)

For each shape x batch (default llama-8b at batch 1 and 8; prompt 128, 128 new tokens, greedy, bf16, random
weights):
- perflab: `--workload generate --option size=SHAPE --kv-cache static --compile reduce-overhead` (the compiled step
  captured in CUDA graphs by perflab, decode_tuning=off: the best bf16 tuning measured, docs/generate.md);
- hf generate: transformers `LlamaForCausalLM(LlamaConfig(...))` (random, bf16, made on the GPU) timed by this bench
  around `generate(cache_implementation="static")`, which compiles the model's one-token step itself
  (reduce-overhead), min_new_tokens = max_new_tokens so nothing stops early; ms per step = (full generate - a
  one-token generate) / (tokens - 1);
- hf via perflab: the same model object and the same generate call through perflab's plugin path, timed whole by
  perflab (examples/hf_llama.py, loop=generate: the loop path); its tokens/s and ms per step must agree with
  generate's within 3% (AGREE_PCT), the table says whether they do;
- hf step via perflab: the same model's one-token step as generate calls it (the same static cache and compiled
  call), through perflab's decode loop (loop=step: the step path): the model's own speed; the table says how much
  generate's own loop adds per token over it (perflab/diagnose/generation_loop.py);
- vllm: `vllm bench latency` with dummy weights (`--load-format dummy`) of the same config; run only when vllm is
  importable. It is not on the device machine (no internet there, and its wheel, ~400 MB, is over the 64 MiB a call
  may carry), so the table gives that reason. `peer_commands` builds the command lines without running them.
Then, at the 8B shape and batch 1 (BENCH_PEERS_QUANT_SHAPE), the quantized part (benchmarks/peers_quantized.py):
int8-weight and int4-weight (torchao) decode through perflab, or the variants BENCH_PEERS_QUANT names (bf16 and
quantized steps with other Inductor settings, graphs or attention; profiled: µs per layer by kind of kernel), then
each scheme through the generation quality gate against the bf16 model (greedy next-token agreement, logits error,
perplexity delta; the gate's judge and tolerances, perflab/quality/generation.py), eager on both sides; on random
weights the gate says it is inconclusive and why (BENCH_PEERS_QUANT_GATE=llama-1b:trained judges a trained model).

The last thing printed is one table: shape x batch x system -> tokens/s, ms per step, % of the bandwidth bound
(weights once per step + every sequence's KV reads, at the calibrated bandwidth), TTFT, tokens/s and ms per step
against the cell's bf16 perflab row, quality; with BENCH_PEERS_QUANT_PROFILE=1 a kernel split per layer before it. Sized to finish in about
8 minutes on an H100 at the defaults; past BENCH_PEERS_BUDGET_S (default 540) the cells left are skipped, so the
table still prints inside a 10-minute call. Without CUDA (or --quick) everything shrinks to llama-tiny on the CPU.
"""
from __future__ import annotations

import importlib.util
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.common import Rows, parse_args
from benchmarks.peers_hf_torchao import parse_hf_schemes
from benchmarks.peers_quantized import DEFAULT_VARIANTS, parse_gate, parse_variants, run_quantized
from benchmarks.peers_common import (Cell, Row, bound_ms_per_step, example_module, free_memory, generate_row,
                                     perflab_settings, result_row, run_perflab, time_hf_generate, version)
AGREE_PCT = 3.0  # hf via perflab vs hf generate
LOOP_TRIALS = 4  # the loop path's trials of 2 request batches: 8 timed generate calls, beside the reference's 7
VLLM_MISSING = ("not run: vllm is not importable here (the device machine has no internet and vllm's wheel, "
                "~400 MB, is over the 64 MiB a call may carry)")


# ---------------------------------------------------------------------------------------------- peers' commands

def vllm_config_dir(shape: str, root: Path) -> Path:
    """A model folder vLLM can load with dummy weights: config.json of the shape, no tokenizer."""
    from perflab.models.decoder import SIZES
    from perflab.models.hf_llama import llama_config_dict
    folder = root / f"vllm-{shape}"
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              **llama_config_dict(SIZES[shape])}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def peer_commands(cell: Cell, model_dir: Path, out: Path, python: str = "python3") -> dict[str, list[str]]:
    """The command line each external peer runs for `cell` (built, not run)."""
    vllm = [python, "-m", "vllm.entrypoints.cli.main", "bench", "latency", "--model", str(model_dir),
            "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
            "--batch-size", str(cell.batch), "--input-len", str(cell.prompt_len),
            "--output-len", str(cell.output_len), "--max-model-len", str(cell.prompt_len + cell.output_len),
            "--num-iters-warmup", "2", "--num-iters", "5",
            "--output-json", str(out / f"vllm-{cell.shape}-bs{cell.batch}.json")]
    return {"vllm": vllm}


def vllm_missing() -> Optional[str]:
    """Why vLLM cannot run here, or None."""
    return None if importlib.util.find_spec("vllm") is not None else VLLM_MISSING


def run_vllm(cell: Cell, out: Path, bound_ms: Optional[float]) -> Row:
    """vLLM's latency benchmark for `cell` in its own process; a Row saying why not when it cannot run."""
    import subprocess
    import sys
    missing = vllm_missing()
    if missing:
        return Row(cell, "vllm", quality=missing)
    command = peer_commands(cell, vllm_config_dir(cell.shape, out), out, sys.executable)["vllm"]
    done = subprocess.run(command, cwd=out, timeout=300, check=False)
    report = Path(command[command.index("--output-json") + 1])
    if done.returncode != 0 or not report.is_file():
        return Row(cell, "vllm", quality=f"failed: exit {done.returncode}")
    latency_s = json.loads(report.read_text())["avg_latency"]  # one batch: prefill + output_len tokens
    return Row(cell, "vllm", cell.batch * cell.output_len / latency_s,
               quality="vllm bench latency (dummy weights); ms/step not separated from the prefill")


# ---------------------------------------------------------------------------------------------- the systems

def off_pct(reference: Row, row: Row) -> dict[str, float]:
    """How far `row` is from `reference`, in %, on each figure both have (tokens/s, ms per step)."""
    pairs = (("tokens/s", row.tokens_per_s, reference.tokens_per_s),
             ("ms/step", row.ms_per_step, reference.ms_per_step))
    return {name: 100 * (mine / theirs - 1) for name, mine, theirs in pairs if mine and theirs}


def too_noisy(row: Row) -> bool:
    """Whether a row's own repeats spread wider than AGREE_PCT either way: no 3% verdict can rest on it."""
    return (row.spread_pct or 0.0) > 2 * AGREE_PCT


def agrees(reference: Row, row: Row) -> Optional[bool]:
    """Whether `row` agrees with `reference` within AGREE_PCT on every figure both have; None without any, or when
    either side's own repeats spread too wide for a 3% verdict (too_noisy)."""
    offs = off_pct(reference, row)
    if not offs or too_noisy(reference) or too_noisy(row):
        return None
    return all(abs(off) <= AGREE_PCT for off in offs.values())


def agreement_note(reference: Row, row: Row) -> str:
    offs = off_pct(reference, row)
    if not offs:
        return "no reference: hf generate has no figures"
    verdict = agrees(reference, row)
    if verdict is None:
        noisy = [f"{name}'s own {what} spread {side.spread_pct:.0f}% (max/min)"
                 for name, what, side in (("hf generate", "calls", reference), ("perflab", "trials", row))
                 if too_noisy(side)]
        said = "inconclusive: " + " and ".join(noisy)
    else:
        said = ("agrees" if verdict else "DISAGREES") + f" (within {AGREE_PCT:g}%)"
    return ", ".join(f"{name} {off:+.1f}%" for name, off in offs.items()) + f" vs hf generate: {said}"


def trials_spread_pct(result) -> Optional[float]:
    """How far apart a perflab run's trials are (max/min - 1 of their throughput), in %; None under two trials."""
    values = [trial.throughput_samples_per_s for trial in result.trials if trial.throughput_samples_per_s]
    return 100 * (max(values) / min(values) - 1) if len(values) > 1 else None


def overhead_note(step: Any, loop: Any) -> str:
    """What generate's own loop adds per token over the model's step (diagnose/generation_loop.py), in words."""
    from perflab.diagnose.generation_loop import loop_overhead  # the finding's figures, read by the table
    if isinstance(step, str) or isinstance(loop, str):
        return "the model's step alone, through perflab's decode loop"
    overhead = loop_overhead(step.metrics.generation, loop.metrics.generation)
    if overhead is None:
        return "the model's step alone, through perflab's decode loop"
    return (f"the model's step alone; generate's own loop adds {overhead.ms_per_token:+.3f} ms per token "
            f"({overhead.pct_of_step:+.1f}% of the step)")


def hf_rows(cell: Cell, reference: Row, loop: Any, step: Any, sync: bool) -> list[Row]:
    """The hf rows of a cell from what ran: transformers' own timing of generate (`reference`), generate timed whole
    by perflab (`loop`: the loop path) and the model's step through perflab's decode loop (`step`: the step path),
    each a perflab Result or the text of why it did not run. Builds the rows without running anything."""
    rows = [reference]
    if isinstance(loop, str):
        rows.append(Row(cell, "hf via perflab", quality=loop))
    else:
        row = result_row(cell, "hf via perflab", loop)
        row.spread_pct = trials_spread_pct(loop)
        row.quality = agreement_note(reference, row) + "; generate timed whole (the loop path)"
        rows.append(row)
    if isinstance(step, str):
        rows.append(Row(cell, "hf step via perflab", quality=step))
    else:
        row = result_row(cell, "hf step via perflab", step)
        row.quality = overhead_note(step, loop) + ("; waits per token as generate does" if sync else "")
        rows.append(row)
    return rows


def run_hf_through_perflab(example, model, out: Path, cell: Cell, cuda: bool, loop: str, sync: bool = False) -> Any:
    """The same model object through perflab's plugin path (examples/hf_llama.py with `loop`): a Result, or why not.
    The example's own static cache and compiled call stand in for perflab's levers (refused for a plugin's cache)."""
    import perflab
    settings = perflab_settings(cell, cuda, levers=False, workload_options={"prompt_len": str(cell.prompt_len),
                                                                            "output_len": str(cell.output_len)})
    if loop == "generate":  # as many timed generate calls as the reference has (LOOP_TRIALS x 2 request batches)
        settings["trials"] = LOOP_TRIALS
    settings.pop("workload")
    folder = "hf-via-perflab" if loop == "generate" else "hf-step-via-perflab"
    cfg = perflab.RunConfig(out=str(out / f"{folder}-{cell.shape}-bs{cell.batch}"), **settings)
    try:
        workload = example.workload(model, cfg, cell.shape, static=True, sync_per_token=sync,
                                    prompt_len=str(cell.prompt_len), output_len=str(cell.output_len), loop=loop)
        return perflab.run(workload, cfg, command=["benchmarks", "generate_peers", f"hf {loop} via perflab"])
    except Exception as err:
        traceback.print_exc()
        return f"failed: {type(err).__name__}: {err}"[:200]


def run_hf(rows: Rows, out: Path, cell: Cell, cuda: bool, bound_ms: Optional[float]) -> list[Row]:
    """hf generate timed by this bench, then the same model through perflab: generate timed whole (must agree), and
    its one-token step through perflab's decode loop (what generate's own loop adds per token)."""
    example = example_module()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        model = example.hf_llama(cell.shape, device, dtype, seed=0)
    except Exception as err:
        return [Row(cell, "hf generate", quality=f"not run: {err}"), Row(cell, "hf via perflab", quality="not run"),
                Row(cell, "hf step via perflab", quality="not run")]
    experiment = f"{cell.shape} bs{cell.batch}"
    try:
        timed = time_hf_generate(example.generate_call(model, static=True), model, cell)
        reference = generate_row(cell, timed, bound_ms, version("transformers"))
        rows.add(experiment, "hf generate tokens/s", timed["tokens_per_s"], "tokens/s", json.dumps(timed))
    except Exception as err:
        traceback.print_exc()
        reference = Row(cell, "hf generate", quality=f"failed: {type(err).__name__}: {err}"[:200])
    sync = not generate_defers_stop_check()
    loop = run_hf_through_perflab(example, model, out, cell, cuda, "generate")
    free_memory()
    step = run_hf_through_perflab(example, model, out, cell, cuda, "step", sync)
    found = hf_rows(cell, reference, loop, step, sync)
    if not isinstance(loop, str) and not isinstance(step, str):
        from perflab.diagnose.generation_loop import loop_overhead  # the finding's figures, for the log
        overhead = loop_overhead(step.metrics.generation, loop.metrics.generation)
        if overhead is not None:
            rows.add(experiment, "generate's own loop per token", overhead.ms_per_token, "ms",
                     f"{overhead.pct_of_step:.1f}% of the step")
    del model
    torch._dynamo.reset()  # its compiled code (and CUDA graph pools) hold the 16 GB model otherwise
    free_memory()
    return found


def generate_defers_stop_check() -> bool:
    """Whether this transformers' generate avoids a host sync per token (its DeferredStopCheck); earlier versions
    read `unfinished_sequences.max() == 0` after every token."""
    try:
        from transformers.generation import utils
    except ImportError:
        return False
    return hasattr(utils, "DeferredStopCheck")


# ---------------------------------------------------------------------------------------------- the area

def grid(full: bool) -> tuple[list[Cell], list[Cell]]:
    """The shape x batch cells (BENCH_PEERS_SHAPES, BENCH_PEERS_BATCHES) and the quantized part's cells (the 8B shape
    at batch 1 and 8; BENCH_PEERS_QUANT_SHAPE, BENCH_PEERS_QUANT_BATCHES; an empty shape: none)."""
    shapes = os.environ.get("BENCH_PEERS_SHAPES", "llama-8b" if full else "llama-tiny").split(",")
    batches = [int(b) for b in os.environ.get("BENCH_PEERS_BATCHES", "1,8" if full else "1,4").split(",")]
    lengths = {} if full else {"prompt_len": 16, "output_len": 8}
    cells = [Cell(shape.strip(), batch, **lengths) for shape in shapes for batch in batches]
    quant_shape = os.environ.get("BENCH_PEERS_QUANT_SHAPE", "llama-8b" if full else "llama-tiny")
    quant_batches = [int(b) for b in os.environ.get("BENCH_PEERS_QUANT_BATCHES", "1,8" if full else "1").split(",")]
    return cells, [Cell(quant_shape.strip(), batch, **lengths) for batch in quant_batches] if quant_shape else []


BF16_SYSTEMS = ("perflab", "perflab bf16")  # a cell's reference for the x-bf16 columns


def format_table(table: list[Row]) -> str:
    """The final table; tokens/s and ms per step also as multiples of the cell's bf16 perflab row."""
    def number(value: Optional[float], digits: int) -> str:
        return "—" if value is None else f"{value:,.{digits}f}"

    def times(value: Optional[float]) -> str:
        return "—" if value is None else f"{value:.2f}x"
    lines = ["shape | batch | system | tokens/s | ms/step | % of bound | TTFT ms | tokens/s x bf16 | step x bf16 | "
             "quality", "---|---|---|---|---|---|---|---|---|---"]
    for row in table:
        bf16 = next((r for r in table if r.cell == row.cell and r.system in BF16_SYSTEMS and r.tokens_per_s), None)
        tokens = row.tokens_per_s / bf16.tokens_per_s if bf16 and row.tokens_per_s else None
        step = bf16.ms_per_step / row.ms_per_step if bf16 and bf16.ms_per_step and row.ms_per_step else None
        lines.append(f"{row.cell.shape} | {row.cell.batch} | {row.system} | {number(row.tokens_per_s, 1)} | "
                     f"{number(row.ms_per_step, 3)} | {number(row.pct_of_bound, 1)} | {number(row.ttft_ms, 1)} | "
                     f"{times(tokens)} | {times(step)} | {row.quality}")
    return "\n".join(lines)


def format_kernel_split(table: list[Row]) -> str:
    """µs per layer of each profiled row's decode steps, by kind of kernel, beside the bound per layer."""
    lines = ["system | step | weight products | no weights (largest) | dequantisation | launch gaps | bound",
             "---|---|---|---|---|---|---"]
    for row in table:
        if not row.kernels:
            continue
        k = row.kernels
        largest = ", ".join(f"{name[:32]} {us:.1f}" for name, us in list(k["top_non_weight"].items())[:2])
        bound = f"{k['bound']:.1f}" if k.get("bound") else "—"
        lines.append(f"{row.system} | {k['step']:.1f} | {k['weight_kernels']:.1f} | {k['non_weight_kernels']:.1f} "
                     f"({largest}) | {k['dequantisation']:.1f} | {k['launch_gaps']:.1f} | {bound}")
    return "\n".join(lines) if len(lines) > 2 else ""


def run(out: Path, quick: bool) -> list[dict]:
    from perflab.calibrate import cached_ceilings, calibrate, memory_bandwidth
    out.mkdir(parents=True, exist_ok=True)
    rows = Rows("generate_peers", out)
    cuda = torch.cuda.is_available()
    full = cuda and not quick
    device = torch.device("cuda" if cuda else "cpu")
    if cuda and not (cached_ceilings(device) or {}).get("memory_gbps"):
        calibrate(device, quick=True)
    gbps, source = memory_bandwidth(device)
    rows.add("calibrate", "device memory bandwidth", gbps, "GB/s", source)
    systems = os.environ.get("BENCH_PEERS_SYSTEMS", "perflab,hf,vllm").split(",")
    variants = parse_variants(os.environ.get("BENCH_PEERS_QUANT", DEFAULT_VARIANTS))
    cells, quant_cells = grid(full)
    table: list[Row] = []
    began = time.perf_counter()
    budget_s = float(os.environ.get("BENCH_PEERS_BUDGET_S", "540"))  # the table must print inside a 600-s call
    for cell in cells:
        bound_ms = bound_ms_per_step(cell, gbps)
        if time.perf_counter() - began > budget_s:
            table.append(Row(cell, ",".join(systems), quality=f"skipped: past BENCH_PEERS_BUDGET_S={budget_s:g}"))
            continue
        if "perflab" in systems:
            table.append(run_perflab(rows, out, cell, cuda))
        if "hf" in systems:
            table += run_hf(rows, out, cell, cuda, bound_ms)
        if "vllm" in systems:
            table.append(run_vllm(cell, out, bound_ms))
        print(f"[generate_peers] {cell}: done at {time.perf_counter() - began:.0f}s", flush=True)
    hf_schemes = parse_hf_schemes(os.environ.get("BENCH_PEERS_QUANT_HF", "int8-weight,int4-weight" if full else ""))
    if quant_cells and (variants or hf_schemes):
        gate = parse_gate(os.environ.get("BENCH_PEERS_QUANT_GATE", ""), quant_cells[0])
        profile = os.environ.get("BENCH_PEERS_QUANT_PROFILE", "") == "1"
        table += run_quantized(rows, out, quant_cells, cuda, variants, profile, gate, began + budget_s,
                               hf_schemes=hf_schemes, gbps=gbps)
        print(f"[generate_peers] quantized: done at {time.perf_counter() - began:.0f}s", flush=True)
    for row in table:
        experiment = f"{row.cell.shape} bs{row.cell.batch}"
        rows.add(experiment, f"{row.system} tokens/s", row.tokens_per_s, "tokens/s", row.quality)
        rows.add(experiment, f"{row.system} ms per step", row.ms_per_step, "ms",
                 f"{row.pct_of_bound:.1f}% of the bound" if row.pct_of_bound else "")
        rows.add(experiment, f"{row.system} TTFT p50", row.ttft_ms, "ms", "")
        if row.kernels:
            rows.add(experiment, f"{row.system} µs per layer by kernel kind", row.kernels["step"], "us",
                     json.dumps({k: v for k, v in row.kernels.items() if k != "top_non_weight"}))
    kernels = format_kernel_split(table)
    text = format_table(table)
    (out / "peers.md").write_text((kernels + "\n\n" if kernels else "") + text + "\n")
    if kernels:
        print("\n" + kernels, flush=True)
    print("\n" + text, flush=True)
    return rows.rows


def main() -> None:
    args = parse_args()
    run(args.out, args.quick)


if __name__ == "__main__":
    main()

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

import gc
import importlib.util
import json
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from benchmarks.bench_generate import measure
from benchmarks.common import Rows, parse_args

ROOT = Path(__file__).resolve().parents[1]
AGREE_PCT = 3.0  # hf via perflab vs hf generate
LOOP_TRIALS = 4  # the loop path's trials of 2 request batches: 8 timed generate calls, beside the reference's 7
NOT_GATED = "not gated (random weights)"
PROMPT_LEN, OUTPUT_LEN = 128, 128
VLLM_MISSING = ("not run: vllm is not importable here (the device machine has no internet and vllm's wheel, "
                "~400 MB, is over the 64 MiB a call may carry)")


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    shape: str
    batch: int
    prompt_len: int = PROMPT_LEN
    output_len: int = OUTPUT_LEN


@dataclass
class Row:
    """One line of the final table."""

    cell: Cell
    system: str
    tokens_per_s: Optional[float] = None
    ms_per_step: Optional[float] = None
    pct_of_bound: Optional[float] = None
    quality: str = ""
    ttft_ms: Optional[float] = None
    kernels: Optional[dict[str, Any]] = None  # µs per layer by kind of kernel (a profiled run)
    spread_pct: Optional[float] = None  # how far apart its repeats were (max/min - 1): generate's calls, perflab's trials
    result: Any = field(default=None, repr=False, compare=False)  # perflab's Result, when perflab ran it


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


# ---------------------------------------------------------------------------------------------- the bound

def bound_ms_per_step(cell: Cell, gbps: Optional[float], model: Optional[torch.nn.Module] = None) -> Optional[float]:
    """The bandwidth bound of one decode step of `cell`, averaged over its decode steps: the weights `model` stores (a
    quantized peer's packed weights and scales), or perflab's bf16 decoder of the cell's shape; KV in bf16."""
    from perflab.generation.metrics import BandwidthBound, RequestTiming, weight_bytes_per_step
    from perflab.models.decoder import SIZES, Decoder
    from perflab.models.kv_cache import kv_cache_bytes
    if not gbps:
        return None
    size = SIZES[cell.shape]
    if model is None:
        with torch.device("meta"):
            model = Decoder(size).to(torch.bfloat16)
    bound = BandwidthBound(weight_bytes_per_step(model, cell.batch),
                           kv_cache_bytes(size.layers, cell.batch, size.kv_heads, size.head_dim, 1, torch.bfloat16),
                           gbps, "")
    request = RequestTiming(cell.batch, cell.prompt_len, [0.0] * cell.output_len, [1] * cell.output_len)
    return bound.decode_bound_ms(request) / (cell.output_len - 1)


# ---------------------------------------------------------------------------------------------- the systems

def example_module():
    spec = importlib.util.spec_from_file_location("hf_llama_example", ROOT / "examples" / "hf_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def perflab_settings(cell: Cell, cuda: bool, levers: bool = True, options: Optional[dict[str, str]] = None,
                     **changes: Any) -> dict[str, Any]:
    """perflab.run's settings for `cell`: bf16, static cache, compiled decode (on a CPU: fp32, static cache); `options`
    adds workload options, `changes` replace settings."""
    compiled = {"kv_cache": "static", **({"compile": "reduce-overhead"} if cuda else {})} if levers else {}
    return {"workload": "generate", "mode": "infer", "batch_size": cell.batch, "precision": "bf16" if cuda else "fp32",
            "steps": 2, "trials": 2, "warmup": 2, "check_quality": False, **compiled,
            "workload_options": {"size": cell.shape, "prompt_len": str(cell.prompt_len),
                                 "output_len": str(cell.output_len), **(options or {})}, **changes}


def result_row(cell: Cell, system: str, result, quality: str = "") -> Row:
    """A perflab run's row: ms per step is its time per output token after the first (the bound's measured figure,
    or the mean TPOT where no bandwidth is known), as diagnose/generation_loop.py compares the two paths by it."""
    from perflab.diagnose.generation_loop import ms_per_token  # the same per-token figure as the finding's
    generation = result.metrics.generation
    bound = generation.bandwidth_bound
    ttft = generation.ttft_ms.p50 if generation.ttft_ms else None
    return Row(cell, system, generation.output_tokens_per_s, ms_per_token(generation),
               bound.pct_of_bound if bound else None, quality, ttft_ms=ttft, result=result)


def run_perflab(rows: Rows, out: Path, cell: Cell, cuda: bool, system: str = "perflab", hooks: Sequence[Any] = (),
                **changes: Any) -> Row:
    result = measure(rows, out, f"{cell.shape} bs{cell.batch}", system, perflab_settings(cell, cuda, **changes),
                     hooks=hooks)
    free_memory()
    if result is None:
        return Row(cell, system, quality="failed (see the log)")
    compiled = result.metrics.generation.decode_compile
    note = f"compile {result.metrics.compile_s:.0f}s" if result.metrics.compile_s else ""
    if compiled is not None:
        note += f", graphs by {compiled.graphs}, tuning {compiled.decode_tuning}, SDPA {compiled.decode_sdpa}"
    return result_row(cell, system, result, note or NOT_GATED)


STEADY_PCT = 2.0  # warm-up ends when two calls in a row agree this closely (or after MAX_WARM_CALLS)
MAX_WARM_CALLS = 8


def time_hf_generate(generate, model, cell: Cell, repeats: int = 7) -> dict[str, Any]:
    """transformers' generate timed whole by this bench (synchronised), after untimed calls until two in a row agree
    within STEADY_PCT (compiling, then CUDA-graph recording: two calls were not enough at batch 8 on an H100, where
    the timed calls then ran 28% slower than perflab's later ones): `generate(input_ids, max_new_tokens)` is
    examples/hf_llama.generate_call, the call perflab's loop path times too."""
    device = model.device
    prompt = torch.randint(0, model.config.vocab_size, (cell.batch, cell.prompt_len), device=device,
                           generator=torch.Generator(device).manual_seed(0))

    def seconds(tokens: int) -> float:
        began = time.perf_counter()
        with torch.inference_mode():
            produced = generate(prompt, tokens)
        synchronize(device)
        assert produced.shape[1] == cell.prompt_len + tokens, "generate stopped early"
        return time.perf_counter() - began
    began = time.perf_counter()
    warm: list[float] = []
    while len(warm) < 2 or (abs(warm[-1] / warm[-2] - 1) * 100 > STEADY_PCT and len(warm) < MAX_WARM_CALLS):
        warm.append(seconds(cell.output_len))
        print(f"[generate_peers] hf generate bs{cell.batch}: untimed call {len(warm)} took {warm[-1]:.2f} s", flush=True)
    warm_s = time.perf_counter() - began
    fulls = [seconds(cell.output_len) for _ in range(repeats)]
    full = statistics.median(fulls)
    prefill = statistics.median(seconds(1) for _ in range(repeats))  # last: a new cache length recompiles
    return {"full_s": full, "prefill_s": prefill, "warm_s": warm_s, "warm_calls_s": [round(v, 4) for v in warm],
            "full_calls_s": [round(v, 4) for v in fulls], "tokens_per_s": cell.batch * cell.output_len / full,
            "ms_per_step": (full - prefill) / (cell.output_len - 1) * 1e3}


def generate_row(cell: Cell, timed: dict[str, float], bound_ms: Optional[float], transformers_version: str) -> Row:
    """transformers' own timing of generate: the reference the loop path must agree with."""
    pct = 100 * bound_ms / timed["ms_per_step"] if bound_ms else None
    calls = timed.get("full_calls_s") or []
    spread = 100 * (max(calls) / min(calls) - 1) if len(calls) > 1 else None
    return Row(cell, "hf generate", timed["tokens_per_s"], timed["ms_per_step"], pct,
               f"transformers {transformers_version}; compile + warm-up {timed['warm_s']:.0f}s" +
               (f"; its {len(calls)} timed calls spread {spread:.1f}%" if spread is not None else ""),
               spread_pct=spread)


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

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version as installed
    try:
        return installed(package)
    except PackageNotFoundError:
        return "?"


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
    # the quantized part imports this module's cells and rows: imported when it runs
    from benchmarks.peers_quantized import (DEFAULT_VARIANTS, parse_gate, parse_hf_schemes, parse_variants,
                                             run_quantized)
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

"""What the generate_peers area's parts share (benchmarks/bench_generate_peers.py, the grid; benchmarks/
peers_quantized.py, the quantized part): a cell and a row of the final table, the bandwidth bound of a cell, perflab's
run of a cell, and transformers' generate timed by the bench."""
from __future__ import annotations

import gc
import importlib.util
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from benchmarks.bench_generate import measure
from benchmarks.common import Rows

ROOT = Path(__file__).resolve().parents[1]
NOT_GATED = "not gated (random weights)"
PROMPT_LEN, OUTPUT_LEN = 128, 128


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
            # a one-token call that took as long as the whole one leaves no per-step time to read (a noisy machine)
            "ms_per_step": (full - prefill) / (cell.output_len - 1) * 1e3 if full > prefill else None}


def generate_row(cell: Cell, timed: dict[str, float], bound_ms: Optional[float], transformers_version: str) -> Row:
    """transformers' own timing of generate: the reference the loop path must agree with."""
    step_ms = timed["ms_per_step"]
    pct = 100 * bound_ms / step_ms if bound_ms and step_ms else None
    calls = timed.get("full_calls_s") or []
    spread = 100 * (max(calls) / min(calls) - 1) if len(calls) > 1 else None
    no_step = ("; no ms per step: its one-token calls took as long as the whole ones (too noisy to subtract)"
               if step_ms is None else "")
    return Row(cell, "hf generate", timed["tokens_per_s"], step_ms, pct,
               f"transformers {transformers_version}; compile + warm-up {timed['warm_s']:.0f}s" +
               (f"; its {len(calls)} timed calls spread {spread:.1f}%" if spread is not None else "") + no_step,
               spread_pct=spread)


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


def report_row(row: Row) -> None:
    """One finished row, printed as soon as it is measured: a call cut short by its time limit keeps it in the log."""
    figures = ", ".join(f"{name} {value:,.{digits}f}" for name, value, digits in
                        (("tokens/s", row.tokens_per_s, 1), ("ms/step", row.ms_per_step, 3),
                         ("% of bound", row.pct_of_bound, 1)) if value is not None)
    print(f"[generate_peers] row: {row.cell.shape} bs{row.cell.batch} | {row.system} | {figures or '—'} | "
          f"{row.quality}", flush=True)

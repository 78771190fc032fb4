"""Area "generate": token generation held to the memory-bandwidth bound, and speculative decoding.

    python -m benchmarks.bench_generate --out DIR [--quick]
    BENCH_GENERATE_ONLY=bandwidth python -m benchmarks.bench_generate --out DIR   # one part (or: speculative)

- "bandwidth": `generate --option size=1b`, batch 1, prompt 128, 128 new tokens, bf16: eager with a dynamic KV
  cache → static cache + torch.compile reduce-overhead (CUDA graphs) with the compile mode's settings alone
  (decode_tuning=off, the default for plain weights) → with gpt-fast's decode settings, graphs by Inductor's cudagraph trees (decode_graphs=inductor)
  → the same with graphs captured by perflab (the default) → decode_tuning=autotune → + int8 weight-only (torchao, gated). Rows: output tokens/s, ms per decode step, the bandwidth bound per step
  and the share of it reached, the host's issue time per step, CUDA-graph skips, TTFT.
- "speculative": speculative decoding on the trained pair (size 350m target, its small draft; trained and cached
  on first use): plain greedy vs K=4, both static cache + compile; rows: acceptance rate, tokens per target
  forward, speed-up.

BENCH_GENERATE_ONLY picks the variants whose "experiment label" contains it, or one of its comma-separated parts
(bandwidth, speculative, eager, decode_tuning=off, decode_graphs=inductor, bf16 compiled, autotune, max-autotune, int8,
plain greedy, K=4), so the parts can run in
separate device calls.

The device bandwidth comes from `perflab calibrate` (run here, quick, when no measurement is cached). Without
CUDA (or with --quick) the sizes shrink to tiny so the area finishes in about a minute on a CPU.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

import perflab
from benchmarks.bench_levers import quality_text, slug
from benchmarks.common import Rows, parse_args
from perflab.calibrate import cached_ceilings, calibrate


def bandwidth_experiment(full: bool) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    size = "1b" if full else "tiny"
    settings = {"workload": "generate", "mode": "infer", "batch_size": 1, "precision": "bf16" if full else "fp32",
                "steps": 3, "trials": 3, "warmup": 2, "quality_steps": 1,
                "workload_options": {"size": size, "prompt_len": "128" if full else "16",
                                     "output_len": "128" if full else "16"}}
    # on a CPU (or --quick) compiling takes minutes on a small shared machine: the static cache alone stands in
    compiled = {"kv_cache": "static", **({"compile": "reduce-overhead"} if full else {})}
    variants = [("eager, dynamic cache", {"check_quality": False})]
    if full:  # labels start differently, so BENCH_GENERATE_ONLY can pick any one of them
        untuned = {**settings["workload_options"], "decode_tuning": "off"}
        tuned = {**settings["workload_options"], "decode_tuning": "gpt-fast"}
        trees = {**tuned, "decode_graphs": "inductor"}
        variants += [("compiled decode (static cache + reduce-overhead), decode_tuning=off",
                      {**compiled, "workload_options": untuned, "check_quality": False}),
                     ("decode_graphs=inductor: tuned, graphs by cudagraph trees",
                      {**compiled, "workload_options": trees, "check_quality": False}),
                     ("bf16 compiled decode + gpt-fast decode tuning",
                      {**compiled, "workload_options": tuned, "check_quality": False}),
                     ("autotune: bf16 compiled decode, decode_tuning=autotune (wider reduction search)",
                      {**compiled, "workload_options": {**settings["workload_options"], "decode_tuning": "autotune"},
                       "check_quality": True}),
                     ("max-autotune: bf16, tuned, graphs by perflab",
                      {**compiled, "compile": "max-autotune", "workload_options": tuned, "check_quality": False}),
                     ("int8-weight compiled decode + gpt-fast decode tuning",
                      {**compiled, "quantize": "int8-weight", "check_quality": True})]
    else:
        variants.append(("static cache", {**compiled, "check_quality": False}))
    return settings, variants


def speculative_experiment(full: bool) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    settings = {"workload": "generate", "mode": "infer", "batch_size": 1, "precision": "bf16" if full else "fp32",
                "steps": 3, "trials": 3, "warmup": 2, "quality_steps": 1,
                "workload_options": {"size": "350m" if full else "tiny", "weights": "trained",
                                     "prompt_len": "128" if full else "16", "output_len": "128" if full else "32"}}
    levers = {"kv_cache": "static", "compile": "reduce-overhead"} if full else {}
    return settings, [("plain greedy (trained target)", {**levers, "check_quality": False}),
                      ("speculative K=4 (trained draft)", {**levers, "speculative": 4, "check_quality": True})]


def chosen(experiment: str, variants: list[tuple[str, dict[str, Any]]], only: str
           ) -> list[tuple[str, dict[str, Any]]]:
    """The variants whose "experiment label" contains `only`, or one of its comma-separated parts (all when empty)."""
    parts = [part.strip() for part in only.split(",")]
    return [(label, changes) for label, changes in variants if any(part in f"{experiment} {label}" for part in parts)]


def run_dir_of(out: Path, experiment: str, label: str) -> Path:
    return out / slug(f"{experiment} {label}")


def measure(rows: Rows, out: Path, experiment: str, label: str, settings: dict[str, Any],
            hooks: Sequence[Any] = ()) -> Optional[perflab.Result]:
    """One perflab.run (wearing `hooks`, e.g. a profiler capture); its result.json saved under out; None (and a row
    saying why) when it fails."""
    run_dir = run_dir_of(out, experiment, label)
    began = time.perf_counter()
    try:
        result = perflab.run(settings["workload"], perflab.RunConfig(out=str(run_dir), **settings),
                             command=["benchmarks", experiment, label], hooks=hooks)
    except Exception as err:  # a failed variant is a finding; the area goes on
        traceback.print_exc()
        rows.add(experiment, f"{label} tokens/s", None, "tokens/s", f"failed: {type(err).__name__}: {err}"[:300])
        return None
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    run_dir.mkdir(parents=True, exist_ok=True)
    result.save(run_dir)
    print(f"[generate] {experiment} · {label}: {time.perf_counter() - began:.0f}s wall", flush=True)
    return result


def add_bound_rows(rows: Rows, experiment: str, label: str, result: perflab.Result) -> float:
    generation = result.metrics.generation
    bound = generation.bandwidth_bound
    compile_s = result.metrics.compile_s
    note = (f"TTFT p50 {generation.ttft_ms.p50:.2f} ms · TPOT p50 {generation.tpot_ms.p50:.3f} ms · "
            f"{quality_text(result)}" + (f" · compile {compile_s:.0f}s" if compile_s else ""))
    rows.add(experiment, f"{label} tokens/s", generation.output_tokens_per_s, "tokens/s", note)
    rows.add(experiment, f"{label} ms per decode step", bound.measured_ms_per_token, "ms",
             f"bound {bound.bound_ms_per_token:.3f} ms = {bound.weight_bytes / 1e9:.3f} GB weights + KV at "
             f"{bound.memory_gbps:.0f} GB/s ({bound.memory_gbps_source})" if bound.bound_ms_per_token else
             bound.memory_gbps_source)
    rows.add(experiment, f"{label} share of the bandwidth bound", bound.pct_of_bound, "%",
             f"measured ÷ bound {bound.measured_over_bound:.2f}x" if bound.measured_over_bound else "")
    compiled = generation.decode_compile
    rows.add(experiment, f"{label} device wait for the host, ms per decode step", bound.device_wait_ms_per_token,
             "ms", f"host issue clock {bound.host_issue_ms_per_token} ms per step (includes launch-queue waits)")
    rows.add(experiment, f"{label} host issue ms per decode step", bound.host_issue_ms_per_token, "ms",
             f"graphs by {compiled.graphs} (captured {compiled.captured_lengths}, skips "
             f"{compiled.cudagraph_skips}) · decode SDPA {compiled.decode_sdpa}"
             if compiled else "eager decode")
    return generation.output_tokens_per_s


def run(out: Path, quick: bool, only: Optional[str] = None) -> list[dict]:
    """Every part, or the variants whose "experiment label" contains `only` (default: $BENCH_GENERATE_ONLY)."""
    only = os.environ.get("BENCH_GENERATE_ONLY", "") if only is None else only
    out.mkdir(parents=True, exist_ok=True)
    rows = Rows("generate", out)
    cuda = torch.cuda.is_available()
    full = cuda and not quick
    device = torch.device("cuda" if cuda else "cpu")
    if not (cached_ceilings(device) or {}).get("memory_gbps"):
        entry = calibrate(device, quick=True)
        rows.add("calibrate", "device memory bandwidth", entry["memory_gbps"], "GB/s", "perflab calibrate --quick")
    else:
        rows.add("calibrate", "device memory bandwidth", cached_ceilings(device)["memory_gbps"], "GB/s", "cached")
    settings, variants = bandwidth_experiment(full)
    name = f"bandwidth bound, generate {settings['workload_options']['size']} bs1"
    for label, changes in chosen(name, variants, only):
        result = measure(rows, out, name, label, {**settings, **changes})
        if result is not None:
            add_bound_rows(rows, name, label, result)
    settings, variants = speculative_experiment(full)
    name = f"speculative {settings['workload_options']['size']} trained pair"
    plain_tokens_per_s = None
    for label, changes in chosen(name, variants, only):
        result = measure(rows, out, name, label, {**settings, **changes})
        if result is None:
            continue
        tokens_per_s = add_bound_rows(rows, name, label, result)
        speculative = result.metrics.generation.speculative
        if speculative is None:
            plain_tokens_per_s = tokens_per_s
            continue
        rows.add(name, "acceptance rate", speculative.acceptance_rate, "", f"K={speculative.k}")
        rows.add(name, "tokens per target forward", speculative.tokens_per_target_forward, "tokens")
        if plain_tokens_per_s:
            rows.add(name, "speculative speed-up", tokens_per_s / plain_tokens_per_s, "x",
                     "output tokens/s vs plain greedy with the same levers")
        elif speculative.speedup_vs_plain is not None:  # plain greedy not run in this call
            rows.add(name, "speculative speed-up (quality gate)", speculative.speedup_vs_plain, "x",
                     speculative.speedup_method or "")
    return rows.rows


def main() -> None:
    args = parse_args()
    run(args.out, args.quick)


if __name__ == "__main__":
    main()

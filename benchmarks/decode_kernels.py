"""Where a compiled batch-1 decode step's time goes, kernel by kernel, and what a few variants of it change.

    python -m benchmarks.decode_kernels --out DIR                       # CUDA only; about 5 minutes
    DECODE_VARIANTS=gpt-fast,gpt-fast+sdpa-efficient python -m benchmarks.decode_kernels --out DIR

For each variant: the built-in decoder (DECODE_SIZE, default 1b) in bf16 with a static KV cache, its decode
step compiled with the variant's Inductor settings and captured by perflab (the path `perflab run --workload generate
--kv-cache static --compile reduce-overhead` takes), one request of prompt 128 + 128 tokens untimed (compiles and
captures), then three timed by CUDA events, then one more under torch.profiler. Rows: ms per decode step, the
share of the memory-bandwidth bound, kernels per step, the time the GPU spends inside kernels per step (the rest
of the step is the gaps between them), the kernels that take most of the step, and the GPU's SM clock while the
step compiled (Inductor's coordinate descent picks kernel configs by timing them at that clock).

Variants: a decode tuning's name (compiled_decode.DECODE_TUNINGS: gpt-fast, autotune, off), optionally with
`+sdpa-efficient` (attention by SDPA's memory-efficient kernel instead of Inductor's generated math), `+combo`
(Inductor's combo kernels: independent kernels launched as one) or `+max-autotune` (that compile mode instead of
reduce-overhead). Each variant compiles in its own process with an empty Inductor cache, so naming one twice
(`gpt-fast,gpt-fast`) shows how much the step moves between compiles; DECODE_KERNELS_BUDGET_S (default 560) caps
the whole run.

On the H100 (2026-11-23) with keys and values in separate buffers: 244 kernels per step and 1.57 ms; one buffer
(kv_cache.py now): 224 kernels and 1.33 ms; the kernels run back to back (busy 96-98% of the step), and the
matrix-vector products' time moved most between compiles.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks.common import Rows
from perflab.generation.decode import generate_greedy
from perflab.generation.metrics import TokenClock

PROMPT, NEW_TOKENS = 128, 128
VARIANTS = "gpt-fast,gpt-fast,autotune,autotune,off,off"


def run_variant(name: str, size: str, device: torch.device, out: Path) -> dict:
    from perflab.generation import compiled_decode
    from perflab.models.decoder import SIZES, Decoder
    from perflab.generation.session import DecoderSession
    from perflab.harness.nvml import NvmlSampler
    from perflab.backends import sdpa_context

    tuning, *parts = name.split("+")
    if "combo" in parts:  # this process compiles this one variant (main() runs each in its own)
        compiled_decode.DECODE_TUNINGS[tuning] = {**compiled_decode.DECODE_TUNINGS[tuning], "combo_kernels": True}
    attention = sdpa_context("efficient") if "sdpa-efficient" in parts else nullcontext
    mode = "max-autotune" if "max-autotune" in parts else "reduce-overhead"
    torch.manual_seed(0)
    model = Decoder(SIZES[size]).to(device=device, dtype=torch.bfloat16).eval()
    with torch.no_grad(), attention():
        session = DecoderSession(model, 1, PROMPT + NEW_TOKENS, True, device, torch.bfloat16, mode,
                                 tuning=tuning, sdpa="efficient" if "sdpa-efficient" in parts else "auto")
        prompt = torch.randint(0, model.size.vocab, (1, PROMPT), device=device)
        began = time.perf_counter()
        # the GPU's clocks while Inductor times its kernel choices: an idle GPU runs at a low clock
        with NvmlSampler(device.index or 0) as sampler:
            generate_greedy(session, prompt, NEW_TOKENS)  # compiles and captures
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - began
        step_ms = [timed_request(session, prompt) for _ in range(3)]
        kernels = profiled_request(session, prompt, out / f"{name}.trace.json")
        session.close()
    return {"compile_s": compile_s, "step_ms": statistics.median(step_ms), "step_ms_all": step_ms,
            "compile_gpu": sampler.summary(), "model": model, **kernels}


def timed_request(session, prompt: torch.Tensor) -> float:
    """ms per decode step of one request: its TPOT, as `perflab run` measures it (TokenClock's CUDA events)."""
    clock = TokenClock(prompt.device)
    generate_greedy(session, prompt, NEW_TOKENS, clock)
    torch.cuda.synchronize()
    return clock.timings()[0].tpot_ms


def profiled_request(session, prompt: torch.Tensor, trace: Path) -> dict:
    """Kernels of one request's decode steps: count, busy time and the top kernels by time, per step."""
    from torch.profiler import ProfilerActivity, profile
    token = session.start(prompt)[:, -1:].argmax(dim=-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(NEW_TOKENS - 1):
            token = session.extend_greedy(token)[:, -1:]
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("cat") == "kernel" and e.get("ph") == "X"]
    events.sort(key=lambda e: e["ts"])
    steps = NEW_TOKENS - 1
    by_name: dict[str, list[float]] = defaultdict(list)
    for event in events:
        by_name[event["name"]].append(event["dur"])
    span_us = events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"] if events else 0.0
    busy_us = sum(e["dur"] for e in events)
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:25]
    trace.unlink()  # large; the rows keep what matters
    return {"kernels_per_step": len(events) / steps, "busy_ms_per_step": busy_us / steps / 1e3,
            "span_ms_per_step": span_us / steps / 1e3,
            "top": [(name[:90], len(durs) / steps, sum(durs) / steps, statistics.median(durs)) for name, durs in top]}


def record_variant(rows: Rows, label: str, name: str, size: str, gbps: float) -> None:
    """Compile, time and profile one variant in this process; its rows under `label`."""
    from perflab.models.kv_cache import kv_cache_bytes
    from perflab.generation.metrics import weight_bytes_per_step
    device = torch.device("cuda")
    try:
        got = run_variant(name, size, device, Path(tempfile.mkdtemp()))
    except Exception as err:  # reported as a row: the parent goes on with the next variant
        rows.add(label, "error", None, "", f"{type(err).__name__}: {str(err)[:300]}")
        return
    model = got.pop("model")
    s = model.size
    mean_positions = PROMPT + NEW_TOKENS / 2
    step_bytes = weight_bytes_per_step(model, 1) + kv_cache_bytes(s.layers, 1, s.kv_heads, s.head_dim,
                                                                  int(mean_positions), torch.bfloat16)
    bound_ms = step_bytes / (gbps * 1e9) * 1e3
    rows.add(label, "ms per decode step", round(got["step_ms"], 4), "ms",
             f"3 requests {[round(v, 4) for v in got['step_ms_all']]}; compile+capture {got['compile_s']:.0f} s")
    rows.add(label, "% of bound", round(100 * bound_ms / got["step_ms"], 1), "%",
             f"bound {bound_ms:.4f} ms = {step_bytes / 1e9:.3f} GB at {gbps:.0f} GB/s")
    rows.add(label, "kernels per step", round(got["kernels_per_step"], 1), "")
    clocks = got["compile_gpu"] or {}
    rows.add(label, "SM clock while compiling (median)", clocks.get("sm_clock_median_mhz"), "MHz",
             f"min {clocks.get('sm_clock_min_mhz')} MHz, max {clocks.get('sm_clock_max_mhz')} MHz, GPU busy "
             f"{clocks.get('util_mean_pct')}% (Inductor's coordinate descent times kernels at whatever clock it finds)")
    rows.add(label, "busy ms per step", round(got["busy_ms_per_step"], 4), "ms",
             f"profiled span {got['span_ms_per_step']:.4f} ms per step; the rest is gaps between kernels")
    for kernel, per_step, us_per_step, median_us in got["top"]:
        rows.add(label, f"kernel {kernel}", round(us_per_step, 1), "us/step",
                 f"{per_step:g} per step, median {median_us:.1f} us")


def main() -> None:
    """Each variant in its own process with its own, empty Inductor cache, so every one is a fresh compile (in one
    process, or with a shared cache, a second compile of the same step reuses the first one's tuned kernels)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one", help="(internal) the variant to run in this process")
    parser.add_argument("--label", default="")
    parser.add_argument("--gbps", type=float, default=0.0)
    args = parser.parse_args()
    size = os.environ.get("DECODE_SIZE", "1b")
    rows = Rows("decode_kernels", args.out)
    if args.one:
        record_variant(rows, args.label or args.one, args.one, size, args.gbps)
        return
    if not torch.cuda.is_available():
        rows.add("decode kernels", "skipped", None, "", "needs CUDA")
        return
    from perflab.calibrate import measure_copy_gbps
    gbps = measure_copy_gbps(torch.device("cuda"), 1024)
    rows.add("device", "copy bandwidth", round(gbps), "GB/s", "read + write of 1 GiB, median of 10")
    budget_s = float(os.environ.get("DECODE_KERNELS_BUDGET_S", "560"))
    began = time.perf_counter()
    for index, name in enumerate(os.environ.get("DECODE_VARIANTS", VARIANTS).split(",")):
        label = f"{name} #{index + 1}"
        left = budget_s - (time.perf_counter() - began)
        if left <= 0:
            rows.add(label, "skipped", None, "", f"past DECODE_KERNELS_BUDGET_S={budget_s:g}")
            continue
        child_out = args.out / f"variant-{index + 1}"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
        command = [sys.executable, "-m", "benchmarks.decode_kernels", "--out", str(child_out), "--one", name,
                   "--label", label, "--gbps", str(gbps)]
        try:
            subprocess.run(command, env=env, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            rows.add(label, "skipped", None, "", f"stopped at DECODE_KERNELS_BUDGET_S={budget_s:g}")
            continue
        child_rows = child_out / "rows.json"
        for row in json.loads(child_rows.read_text()) if child_rows.exists() else []:
            rows.add(row["experiment"], row["metric"], row["value"], row["unit"], row["note"])
    print("\n" + "\n".join(f"{r['experiment']:28s} {r['metric'][:60]:60s} {r['value']} {r['unit']}"
                           for r in rows.rows if not r["metric"].startswith("kernel ")))


if __name__ == "__main__":
    main()

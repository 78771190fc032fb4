"""The quantized part of the generate_peers area (benchmarks/bench_generate_peers.py): bf16, int8 and int4
weight-only decode at its cells (the 8B shape, batch 1 and 8), in the variants that say where a quantized step loses
what its fewer bytes should win, beside HF transformers + torchao, then the generation gate of each scheme against the
bf16 model.

    BENCH_PEERS_QUANT=int8-weight,int4-weight          (default) each scheme through perflab's own levers
    BENCH_PEERS_QUANT=bf16,int8-weight+torchao,...      variants: SCHEME[+CHANGE...], or a preset's name (PRESETS)
    BENCH_PEERS_QUANT_SHAPE=llama-8b BENCH_PEERS_QUANT_BATCHES=1,8   the cells (defaults on a GPU)
    BENCH_PEERS_QUANT_HF=int8-weight,int4-weight        HF + torchao for these schemes (the default on a GPU; empty:
                                                        none; benchmarks/peers_hf_torchao.py), each in a process of its own
    BENCH_PEERS_QUANT_HF_LIMIT_S=240                    that process's time limit (load, compile, every cell)
    BENCH_PEERS_QUANT_PROFILE=1                         profile one request of each variant: µs per layer
    BENCH_PEERS_QUANT_GATE=none | SHAPE | SHAPE:trained the gate's model (default: the cell's shape, random weights)

Issue 39's two device calls (torchao 0.18.0 and gemlite 0.5.1.post1 as wheels), one batch size each, so that every
call has its own bf16 reference and HF + torchao rows beside perflab's; the first adds the 1B per-layer split of both
kernels of each scheme, the second the gate on a trained llama-1b:

    S="BENCH_PEERS_SYSTEMS=none BENCH_PEERS_QUANT_GATE=none"
    env $S BENCH_PEERS_QUANT=schemes BENCH_PEERS_QUANT_BATCHES=1 python -m benchmarks.bench_generate_peers --out A
    env $S BENCH_PEERS_QUANT=split BENCH_PEERS_QUANT_SHAPE=llama-1b BENCH_PEERS_QUANT_BATCHES=1 BENCH_PEERS_QUANT_HF= \
        BENCH_PEERS_QUANT_PROFILE=1 python -m benchmarks.bench_generate_peers --out B
    env $S BENCH_PEERS_QUANT=schemes BENCH_PEERS_QUANT_BATCHES=8 python -m benchmarks.bench_generate_peers --out C
    BENCH_PEERS_SYSTEMS=none BENCH_PEERS_QUANT=int8-weight,int4-weight BENCH_PEERS_QUANT_SHAPE=llama-1b \
        BENCH_PEERS_QUANT_BATCHES=1 BENCH_PEERS_QUANT_HF= BENCH_PEERS_QUANT_GATE=llama-1b:trained python -m ... --out D

A variant is a scheme (bf16: no quantization, the reference; int8-weight, int4-weight, fp8) with changes, each
`+NAME`: a decode tuning (perflab/workloads/generation.py's DECODE_TUNINGS: gpt-fast, autotune, torchao, mm-templates,
off), `inductor-graphs` (Inductor's cudagraph trees capture the step instead of perflab) or `sdpa-efficient` (the
decode attention by SDPA's memory-efficient kernel, not Inductor's generated math) or a kernel for the quantized
weights (`gemlite`, `torchao-kernel`: perflab's --quantize-kernel; KERNELS below; the plain scheme takes perflab's
default, auto, which is gemlite for int8 where gemlite is installed). Every variant runs
`--kv-cache static --compile reduce-overhead` like the grid's perflab row. Profiled, a variant's first trial records
one request, and the table's kernel split gives per layer: the weight products, the kernels that read no weights,
standalone dequantisation and the GPU's idle gaps, beside the bound (perflab/diagnose/decode.py).

The diagnostic of issue 28 (on the H200: int8 0.88x and int4 1.23x of bf16's tokens/s at llama-8b) is the preset
BENCH_PEERS_QUANT=diagnostic (PRESETS), one device call on an H100 in about 8 minutes (estimated from the H200's
38-78 s per 8B run; no variant starts past BENCH_PEERS_BUDGET_S, and the table still prints); `diagnostic-more` is the
second call, for the settings that matter less if the first call's kernels explain the gap:

    BENCH_PEERS_SYSTEMS=none BENCH_PEERS_QUANT=diagnostic BENCH_PEERS_QUANT_PROFILE=1 BENCH_PEERS_QUANT_GATE=none \
    BENCH_PEERS_BUDGET_S=390 python -m benchmarks.bench_generate_peers --out OUT

bf16 against bf16+gpt-fast: whether Inductor's generated matrix-vector products (what int8 compiles to by default)
read slower than cuBLAS's at this shape; int8 through torchao's kernel against int8 through gemlite: whether
Inductor's products are what hold the scheme back, against gemlite's GEMV (the gemlite row needs gemlite < 0.6
installed beside torchao 0.18, and says so otherwise); TTFT against ms/step: how much of a scheme's tokens/s its eager prefill takes; the kernel
split: which kernels hold each step. diagnostic-more: int8 with Triton's matmul templates or torchao's Inductor
settings, SDPA's attention instead of Inductor's generated one, Inductor's CUDA graphs instead of perflab's.
"""
from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.bench_generate import run_dir_of
from benchmarks.common import Rows
from benchmarks.peers_common import (NOT_GATED, PROMPT_LEN, Cell, Row, example_module, free_memory, report_row,
                                     run_perflab)
from benchmarks.peers_hf_torchao import run_hf_torchao
from perflab.results.quality import QualityVerdict

DEFAULT_VARIANTS = "int8-weight,int4-weight"
# BENCH_PEERS_QUANT=NAME runs a preset's variants; each fits one device call on an H100 and starts with its bf16
# reference (the x-bf16 columns compare within a call, on one card)
PRESETS = {
    # issue 39's two calls: each scheme through perflab's default kernel (gemlite where installed), beside HF + torchao
    # at the 8B shape, batch 1 and 8; then the per-layer split of both kernels of each scheme at 1B, and the gate
    "schemes": "bf16,int8-weight,int4-weight",
    "split": "bf16,int8-weight+torchao-kernel,int8-weight+gemlite,int4-weight+torchao-kernel,int4-weight+gemlite",
    "diagnostic": "bf16,int8-weight+torchao-kernel,int4-weight,bf16+gpt-fast,int8-weight+gemlite",
    "diagnostic-more": "bf16,int8-weight+mm-templates,int8-weight+torchao,int8-weight+sdpa-efficient,"
                       "int8-weight+inductor-graphs",
}
SCHEMES = ("bf16", "int8-weight", "int4-weight", "fp8")  # bf16: the weights as they are
# A variant's changes besides decode tunings: (run settings, workload options)
CHANGES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "inductor-graphs": ({}, {"decode_graphs": "inductor"}),
    "sdpa-efficient": ({"sdpa": "efficient"}, {}),
}
# The kernel of a variant's quantized weights (perflab's --quantize-kernel; the plain scheme takes perflab's default,
# auto): `gemlite` (gemlite's Triton GEMV through torchao's UIntxWeightOnlyConfig) or `torchao-kernel` (torchao's
# default: Inductor's generated product for int8, tinygemm for int4).
KERNELS = {"gemlite": "gemlite", "torchao-kernel": "torchao"}


@dataclass(frozen=True)
class Variant:
    """One quantized-part run: a scheme (None: bf16) and its changes, named as BENCH_PEERS_QUANT names it."""

    name: str
    scheme: Optional[str]
    settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)


def parse_variants(text: str) -> list[Variant]:
    """BENCH_PEERS_QUANT: comma-separated variants, or a preset's name."""
    return [parse_variant(item) for item in PRESETS.get(text.strip(), text).split(",") if item.strip()]


def parse_variant(text: str) -> Variant:
    """'int8-weight+torchao+inductor-graphs' -> Variant; a ValueError naming the choices otherwise."""
    from perflab.workloads.generation import DECODE_TUNINGS
    scheme, *changes = text.strip().split("+")
    if scheme not in SCHEMES:
        raise ValueError(f"BENCH_PEERS_QUANT: {text!r} starts with {scheme!r}; a variant starts with one of "
                         f"{', '.join(SCHEMES)}")
    settings: dict[str, Any] = {}
    options: dict[str, str] = {}
    for change in changes:
        if change in KERNELS:
            if scheme == "bf16":
                raise ValueError(f"BENCH_PEERS_QUANT: {text!r}: {change} picks a quantized scheme's kernel")
            settings["quantize_kernel"] = KERNELS[change]
        elif change in DECODE_TUNINGS:
            options["decode_tuning"] = change
        elif change in CHANGES:
            settings.update(CHANGES[change][0])
            options.update(CHANGES[change][1])
        else:
            raise ValueError(f"BENCH_PEERS_QUANT: unknown change {change!r} in {text!r}; changes are a decode tuning "
                             f"({', '.join(DECODE_TUNINGS)}) or one of {', '.join([*CHANGES, *KERNELS])}")
    return Variant(text.strip(), None if scheme == "bf16" else scheme, settings, options)


def parse_gate(text: str, cell: Cell) -> Optional[tuple[str, str]]:
    """BENCH_PEERS_QUANT_GATE -> (shape, weights) of the gate's model, or None ('none')."""
    text = text.strip()
    if text == "none":
        return None
    shape, _, weights = (text or cell.shape).partition(":")
    if weights not in ("", "random", "trained"):
        raise ValueError(f"BENCH_PEERS_QUANT_GATE: {text!r}; expected none, SHAPE or SHAPE:trained")
    return shape, weights or "random"


# ---------------------------------------------------------------------------------------------- timed variants

def run_variant(rows: Rows, out: Path, cell: Cell, cuda: bool, variant: Variant, profile: bool) -> Row:
    """One variant through perflab.run (profiled when asked); its row, with TTFT and the kernel split."""
    from perflab.generation.quantize import scheme_refusal
    system = f"perflab {variant.name}"
    if variant.scheme is not None:
        why = scheme_refusal(variant.scheme, torch.device("cuda" if cuda else "cpu"), "bf16" if cuda else "fp32",
                             variant.settings.get("quantize_kernel", "auto"))
        if why:
            return Row(cell, system, quality=f"not run: {why}")
    hooks = []
    changes: dict[str, Any] = dict(variant.settings, quantize=variant.scheme, options=variant.options)
    if profile:
        from perflab.profile.capture import CaptureOptions, ProfilerCapture
        # the first trial's second request is recorded (the first warms the profiler up); a third trial
        # keeps the median off the profiled one. No module ranges: their hooks would make Dynamo re-check (and, with
        # Inductor's graphs, recompile) the compiled step, and the split needs kernels only.
        capture = ProfilerCapture(run_dir_of(out, f"{cell.shape} bs{cell.batch}", system),
                                  CaptureOptions(wait=0, warmup=1, active=1, record_shapes=False), with_modules=False)
        hooks, changes["trials"] = [capture], 3
    row = run_perflab(rows, out, cell, cuda, system, hooks=hooks, **changes)
    if profile and row.result is not None and capture.written:
        row.kernels = kernel_split(capture.trace_path, row.result)
        capture.trace_path.unlink()  # large; the split keeps what matters
    return row


def kernel_split(trace_path: Path, result) -> Optional[dict[str, Any]]:
    """µs per layer of the traced decode steps: weight products, kernels that read no weights, dequantisation, gaps."""
    from perflab.diagnose.decode import traced_layer_costs
    from perflab.diagnose.trace import load_trace
    costs = traced_layer_costs(load_trace(trace_path), result.metrics.generation, int(result.workload["info"]["layers"]))
    return costs.per_layer_us() if costs is not None else None


# ---------------------------------------------------------------------------------------------- the gate

def quantized_gate(shape: str, weights: str, scheme: str, cuda: bool, requests: int = 2,
                   new_tokens: int = 32, kernel: str = "torchao") -> QualityVerdict:
    """The generation gate's judge of `scheme` (rounded for `kernel`, resolved_kernel's) against the same model in
    bf16 (both eager, dynamic cache): greedy agreement, logits error and perplexity delta with the scheme's
    tolerances; inconclusive, with the reason, when the bf16 model is too unsure of its own tokens (random weights) to
    judge by."""
    from perflab.generation.decode import generate_greedy, teacher_forced_logits
    from perflab.generation.quantize import quantize_weights
    from perflab.generation.session import open_session
    from perflab.models.decoder import SIZES
    from perflab.models.language import SyntheticLanguage, perplexity
    from perflab.quality.generation import SCHEME_LOGITS_RTOL, SCHEME_PERPLEXITY_RTOL, Compared, judge
    device = torch.device("cuda" if cuda else "cpu")
    size = SIZES[shape]
    base = reference_model(shape, weights, device)
    candidate = quantize_weights(copy.deepcopy(base), scheme, kernel)
    language = SyntheticLanguage(size.vocab)
    prompts = language.sample(requests, PROMPT_LEN, seed=11).to(device)
    base_logits, cand_logits = [], []
    with torch.inference_mode():
        for prompt in prompts.split(1):
            base_session = open_session(base, 1, PROMPT_LEN + new_tokens, device, torch.bfloat16)
            reference = generate_greedy(base_session, prompt, new_tokens)
            base_logits.append(teacher_forced_logits(base_session, prompt, reference).cpu())
            cand_session = open_session(candidate, 1, PROMPT_LEN + new_tokens, device, torch.bfloat16)
            cand_logits.append(teacher_forced_logits(cand_session, prompt, reference).cpu())
            base_session.close()
            cand_session.close()
        evaluation = language.sample(4, 128, seed=99).to(device)
        figures = Compared(baseline_logits=base_logits, candidate_logits=cand_logits,
                           perplexity_baseline=perplexity(base, evaluation, batch=1),
                           perplexity_candidate=perplexity(candidate, evaluation, batch=1))
    tolerance = {"rtol": SCHEME_LOGITS_RTOL[scheme], "perplexity_rtol": SCHEME_PERPLEXITY_RTOL[scheme],
                 "source": f"{scheme} vs bf16"}
    del base, candidate
    free_memory()
    return judge(figures, tolerance, speculative=False)


def reference_model(shape: str, weights: str, device: torch.device):
    """The gate's bf16 model: random (made on the device in bf16: llama-8b is 16 GB) or trained on the synthetic
    language (perflab/models/language.py, cached)."""
    from perflab.models.decoder import SIZES, Decoder
    from perflab.models.language import trained_decoder
    if weights == "trained":
        model, _ = trained_decoder(shape, "target", SIZES[shape], device)
        return model.to(device, torch.bfloat16).eval()
    torch.manual_seed(0)
    with device, example_module().default_dtype(torch.bfloat16):
        return Decoder(SIZES[shape]).to(torch.bfloat16).eval()


def gate_text(verdict: QualityVerdict, shape: str, weights: str, kernel: str) -> str:
    """One line of a QualityVerdict of the generation gate."""
    figures = verdict.metrics
    return (f"gate vs bf16 ({shape}, {weights} weights, rounded for {kernel}): {verdict.verdict}; greedy agreement "
            f"{100 * figures.greedy_agreement:.1f}%, logits error {figures.rel_error:.2e}, perplexity "
            f"{100 * figures.perplexity_rel_delta:+.2f}%, bf16 confident at "
            f"{100 * figures.baseline_confident_share:.0f}% of positions")


def run_gates(rows: Rows, table: list[Row], cell: Cell, cuda: bool, schemes: list[str],
              gate: tuple[str, str]) -> None:
    """Each scheme's gate, its text on the first row of that scheme that ran (every scheme has a row: `schemes`
    come from the variants)."""
    shape, weights = gate
    for scheme in schemes:
        ran = [r for r in table if r.system.split(" ", 1)[-1].split("+")[0] == scheme]
        row = next((r for r in ran if r.result is not None), ran[0])
        if row.result is None:  # refused here (int4 and fp8 need CUDA), or its run failed
            text = "gate not run: no variant of the scheme ran"
        else:
            try:
                from perflab.generation.quantize import resolved_kernel
                kernel, _ = resolved_kernel(scheme, "auto", torch.device("cuda" if cuda else "cpu"))
                verdict = quantized_gate(shape, weights, scheme, cuda, kernel=kernel)
                text = gate_text(verdict, shape, weights, kernel)
                rows.add(f"{cell.shape} bs{cell.batch}", f"{scheme} gate vs bf16",
                         verdict.metrics.greedy_agreement, "", verdict.reason)
            except Exception as err:
                traceback.print_exc()
                text = f"gate failed: {type(err).__name__}: {err}"[:200]
        row.quality = f"{row.quality}; {text}" if row.quality and row.quality != NOT_GATED else text
        print(f"[generate_peers] gate {scheme}: {text}", flush=True)


# ---------------------------------------------------------------------------------------------- the part

def run_quantized(rows: Rows, out: Path, cells: list[Cell], cuda: bool, variants: list[Variant], profile: bool,
                  gate: Optional[tuple[str, str]], deadline: float, hf_schemes: tuple[str, ...] = (),
                  gbps: Optional[float] = None) -> list[Row]:
    """The timed variants at each cell, then HF + torchao for each of `hf_schemes`, then the gates; none started past
    `deadline` (time.perf_counter)."""
    table: list[Row] = []
    for cell in cells:
        for variant in variants:
            if time.perf_counter() > deadline:
                table.append(Row(cell, f"perflab {variant.name}", quality="skipped: past BENCH_PEERS_BUDGET_S"))
                continue
            table.append(run_variant(rows, out, cell, cuda, variant, profile))
            report_row(table[-1])
    schemes = list(dict.fromkeys(v.scheme for v in variants if v.scheme is not None))
    if hf_schemes:
        table += run_hf_torchao(rows, cells, cuda, list(hf_schemes), deadline, gbps)
    if gate is not None and schemes:
        if time.perf_counter() > deadline:
            table.append(Row(cells[0], "gates", quality="skipped: past BENCH_PEERS_BUDGET_S"))
        else:
            run_gates(rows, table, cells[0], cuda, schemes, gate)
    return table

"""Generation levers: a static KV cache, weight quantization (torchao) and speculative decoding.

Each records its choice in the plan's GenerationSettings; perflab.generation.plan.prepare_generation applies
them in one fixed order once every lever has run. They apply to workloads that generate tokens
(Workload.generation): `--workload generate`, or a causal LM given through perflab.generation.
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import (COMPUTE_BOUND, DECODE_BANDWIDTH_BOUND, DECODE_COMPUTE_BOUND, DECODE_KERNEL_EFFICIENCY,
                                 DECODE_LAUNCH_BOUND, LAUNCH_OVERHEAD, MEMORY_BANDWIDTH)
from perflab.generation.quantize import scheme_refusal
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints, first_refusal


def needs_generation(cfg, workload, device) -> Optional[str]:
    if workload.generation is None:
        return f"{workload.name} does not generate tokens; try --workload generate --mode infer"
    return None


def own_loop_refusal(cfg, workload, device) -> Optional[str]:
    """A workload that times its own generation loop (GenerationSpec.generate_fn) decides its cache, compilation and
    decoding itself: perflab's decode-loop levers do not reach inside it."""
    if workload.generation is not None and workload.generation.generate_fn is not None:
        return ("this workload times its own generation loop (generate_fn), which keeps its own cache and decoding: "
                "set them in that loop (transformers: generate(cache_implementation='static'), assistant_model=...), "
                "or build the workload without generate_fn to time the model's step through perflab's decode loop")
    return None


def _needs_builtin_decoder(cfg, workload, device) -> Optional[str]:
    if not workload.generation.builtin_decoder:
        return ("this model keeps its own cache (the transformers calling convention); the static cache is the "
                "built-in decoder's: use --workload generate")
    return None


def _quantize_checks(cfg, workload, device) -> Optional[str]:
    return scheme_refusal(cfg.quantize, device, cfg.precision, cfg.quantize_kernel)


def _set(name: str, value_of):
    def apply(plan, cfg) -> None:
        setattr(plan.generation, name, value_of(cfg))
    return apply


# The decode rule (perflab/diagnose/decode.py) names these by the decode step's regime (each address's `when`);
# the trace rules do not name them.
FEWER_BYTES_LOST = ("the weights' bytes are not what limits this decode step; a larger decode batch, or --kv-cache "
                    "static --compile reduce-overhead when it waits on launches")


def _quantize_lever(scheme: str, summary: str, needs: str, addresses: tuple[Address, ...], in_code: str) -> Lever:
    return Lever(scheme, "quantize", scheme, summary, needs, addresses, 50,
                 _set("quantize", lambda cfg: cfg.quantize),
                 in_code=in_code, when_lost=f"{scheme} weights lost: {FEWER_BYTES_LOST}",
                 tune=TuneHints(ONE_TRIAL), checks=first_refusal(needs_generation, _quantize_checks))


LEVERS = [
    Lever("kv-cache-static", "kv_cache", "static", "pre-allocated KV cache: fixed shapes, so --compile "
          "reduce-overhead can capture the decode step", "a generation workload with the built-in decoder",
          (Address(LAUNCH_OVERHEAD, 1, DECODE_LAUNCH_BOUND),), 55, _set("static_cache", lambda cfg: True),
          in_code="a pre-allocated KV cache (transformers: generate(..., cache_implementation='static')), "
                  "with the decode step compiled (mode='reduce-overhead')",
          when_lost="the static KV cache lost: launching is not what limits this decode step; read fewer bytes per "
                    "token (quantized weights) or make more tokens per read (speculative decoding)",
          tune=TuneHints(ONE_TRIAL),
          checks=first_refusal(needs_generation, own_loop_refusal, _needs_builtin_decoder)),
    _quantize_lever("int8-weight", "int8 weight-only quantization (torchao): half the bytes of bf16 per decode step",
                    "torchao (pip install 'perflab[quant]'), a generation workload",
                    (Address(MEMORY_BANDWIDTH, 1, DECODE_BANDWIDTH_BOUND),
                     Address(MEMORY_BANDWIDTH, 1, DECODE_KERNEL_EFFICIENCY)),
                    "torchao.quantization.quantize_(model, int8_weight_only())"),
    _quantize_lever("fp8", "fp8 weight-only quantization (torchao)",
                    "torchao, CUDA with compute capability 8.9+ (Ada, Hopper), a generation workload",
                    (Address(MEMORY_BANDWIDTH, 3, DECODE_BANDWIDTH_BOUND),
                     Address(COMPUTE_BOUND, 2, DECODE_COMPUTE_BOUND)),
                    "torchao.quantization.quantize_(model, float8_weight_only())"),
    _quantize_lever("int4-weight", "int4 weight-only quantization, group size 128 (torchao tinygemm; gemlite with "
                    "--quantize-kernel gemlite)",
                    "torchao, CUDA, --precision bf16, a generation workload",
                    (Address(MEMORY_BANDWIDTH, 2, DECODE_BANDWIDTH_BOUND),),
                    "torchao.quantization.quantize_(model, int4_weight_only(group_size=128)) on a bf16 CUDA model"),
    Lever("speculative", "speculative", None, "speculative decoding: a draft proposes K tokens, the target "
          "verifies them in one forward",
          "a generation workload timed through perflab's decode loop (no generate_fn); a draft (built-in or --draft)",
          (Address(MEMORY_BANDWIDTH, 4, DECODE_BANDWIDTH_BOUND),
           Address(MEMORY_BANDWIDTH, 2, DECODE_KERNEL_EFFICIENCY)),
          56, _set("speculative_k", lambda cfg: cfg.speculative),
          in_code="model.generate(..., assistant_model=draft) (transformers assisted generation)",
          when_lost="speculative decoding lost: the target rejects too many of the draft's tokens, or the draft "
                    "costs too much: a smaller draft, or fewer tokens per guess (a smaller K)",
          tune=TuneHints(ONE_TRIAL), checks=first_refusal(needs_generation, own_loop_refusal)),
]

"""--sdpa flash|efficient|math: pin scaled_dot_product_attention to one backend for the whole run.

`auto` (the default) lets PyTorch choose per call. Pinning a backend shows what each kernel costs, and
a pinned backend that cannot serve a call fails loudly instead of silently falling back. FlashAttention
needs CUDA and half precision (bf16/fp16); the memory-efficient kernel needs CUDA; math runs anywhere.
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import ACTIVATION_MEMORY, ATTENTION, COMPUTE_BOUND, HAND_WRITTEN_ATTENTION, MEMORY_BANDWIDTH
from perflab.backends import sdpa_context
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints, first_refusal

def _needs_attention(cfg, workload, device) -> Optional[str]:
    if not workload.uses_attention:
        return (f"{workload.name} does not use scaled_dot_product_attention (Workload.uses_attention is "
                "False); try --workload transformer")
    return None


def _takes_no_mask(cfg, workload, device) -> Optional[str]:
    if cfg.kv_cache == "static":
        return ("FlashAttention takes no attention mask, and the static KV cache masks the positions not yet "
                "written: use --sdpa efficient or math, or --kv-cache dynamic")
    return None


def _needs_half(cfg, workload, device) -> Optional[str]:
    if cfg.precision not in ("bf16", "fp16"):
        return f"FlashAttention runs in bf16/fp16 only, this run is {cfg.precision}; add --precision bf16"
    return None


def _apply(plan, cfg) -> None:
    plan.run_contexts.append(sdpa_context(cfg.sdpa))


LEVERS = [
    Lever("sdpa-flash", "sdpa", "flash", "FlashAttention kernel for scaled_dot_product_attention",
          "CUDA, --precision bf16/fp16, an attention workload",
          (Address(COMPUTE_BOUND, 6, ATTENTION), Address(MEMORY_BANDWIDTH), Address(ACTIVATION_MEMORY),
           Address(COMPUTE_BOUND, 1, HAND_WRITTEN_ATTENTION), Address(MEMORY_BANDWIDTH, 1, HAND_WRITTEN_ATTENTION)),
          35, _apply,
          in_code="with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION): around attention",
          when_lost="flash attention lost: try the efficient backend, or a longer sequence per call",
          tune=TuneHints(ONE_TRIAL), checks=first_refusal(_needs_attention, _needs_half, _takes_no_mask)),
    Lever("sdpa-efficient", "sdpa", "efficient", "memory-efficient attention kernel for scaled_dot_product_attention",
          "CUDA, an attention workload",
          (Address(MEMORY_BANDWIDTH), Address(ACTIVATION_MEMORY), Address(COMPUTE_BOUND, 2, HAND_WRITTEN_ATTENTION),
           Address(MEMORY_BANDWIDTH, 2, HAND_WRITTEN_ATTENTION)), 35, _apply,
          in_code="with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION): around attention",
          when_lost="memory-efficient attention lost: try flash attention (bf16/fp16), or leave the choice to "
                    "PyTorch (--sdpa auto)",
          tune=TuneHints(ONE_TRIAL), checks=_needs_attention),
    Lever("sdpa-math", "sdpa", "math", "the reference (math) attention: materialises the score matrix",
          "an attention workload", (Address(COMPUTE_BOUND),), 35, _apply,
          in_code="with torch.nn.attention.sdpa_kernel(SDPBackend.MATH): around attention",
          when_lost="the math attention lost: a fused kernel is faster here: flash (bf16/fp16) or efficient",
          tune=TuneHints(ONE_TRIAL), checks=_needs_attention),
]

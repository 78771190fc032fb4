"""--sdpa flash|efficient|math: pin scaled_dot_product_attention to one backend for the whole run.

`auto` (the default) lets PyTorch choose per call. Pinning a backend shows what each kernel costs, and
a pinned backend that cannot serve a call fails loudly instead of silently falling back. FlashAttention
needs CUDA and half precision (bf16/fp16); the memory-efficient kernel needs CUDA; math runs anywhere.
"""
from __future__ import annotations

from typing import Callable, ContextManager, Optional

from perflab.levers import Lever, first_refusal

BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_context(backend: str) -> Callable[[], ContextManager]:
    """A factory of `sdpa_kernel(<backend>)` contexts (torch >= 2.3)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = getattr(SDPBackend, BACKENDS[backend])
    return lambda: sdpa_kernel(chosen)


def _needs_attention(cfg, workload, device) -> Optional[str]:
    if not workload.uses_attention:
        return (f"{workload.name} does not use scaled_dot_product_attention (Workload.uses_attention is "
                "False); try --workload transformer")
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
          ("compute bound", "memory bandwidth", "activation memory"), 35, _apply,
          first_refusal(_needs_attention, _needs_half)),
    Lever("sdpa-efficient", "sdpa", "efficient", "memory-efficient attention kernel for scaled_dot_product_attention",
          "CUDA, an attention workload", ("memory bandwidth", "activation memory"), 35, _apply, _needs_attention),
    Lever("sdpa-math", "sdpa", "math", "the reference (math) attention: materialises the score matrix",
          "an attention workload", ("compute bound",), 35, _apply, _needs_attention),
]

"""What a generating workload declares (GenerationSpec, the decode step's named Inductor settings) and its requests.

Requests: prompts from the synthetic language, with prompt and output lengths drawn from distributions.

A length option is one number (`128`) or a uniform range (`64-256`). A request batch shares one prompt length
and one output length (those of its first request): the collate function cuts every prompt to it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from perflab.errors import PerflabError
from perflab.models.language import SyntheticLanguage


# gpt-fast's generate.py settings. unique_kernel_names: profiler traces name each kernel after the ops it fuses;
# fx_graph_cache: a second process (the quality gate, a rerun) loads the compiled graph instead of compiling again.
GPT_FAST_OPTIONS = {"coordinate_descent_tuning": True, "triton.unique_kernel_names": True, "fx_graph_cache": True}
# torchao's own settings for its quantized models (torchao.quantization.utils.recommended_inductor_config_setter, 0.18):
# gpt-fast's, plus coordinate descent that tries every direction from each config before it stops.
TORCHAO_OPTIONS = {**GPT_FAST_OPTIONS, "coordinate_descent_check_all_directions": True,
                   "force_fuse_int_mm_with_mul": True}
# Inductor's Triton matmul templates instead of its decomposed products: without coordinate descent a (1, K) x (K, N)
# product stays a matmul, max_autotune picks the template's block sizes by timing them, and an int8 weight's widening
# to bf16 fuses into the template's loads (Inductor's prologue fusion) instead of being written out first.
MM_TEMPLATE_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON",
                       "triton.unique_kernel_names": True, "fx_graph_cache": True}
# The decode step's Inductor settings by name (--option decode_tuning).
DECODE_TUNINGS: dict[str, dict[str, Any]] = {
    "gpt-fast": GPT_FAST_OPTIONS,
    "autotune": {**GPT_FAST_OPTIONS, "max_autotune_pointwise": True},
    "torchao": TORCHAO_OPTIONS,
    "mm-templates": MM_TEMPLATE_OPTIONS,
    "off": {},
}
# The defaults: plain weights by cuBLAS (as fast as the tuned kernels in the median on the H100, the same time in
# every compile, a third of the compile time); quantized weights through torchao's default kernel by Inductor's
# generated products, the only ones that fuse the dequantisation (otherwise the int8 weights are widened to bf16 in
# memory before every product). Weights through gemlite's kernels (opaque to Inductor) take the plain default: the
# coordinate descent would tune only the small kernels around them, and it took 114 of a run's 132 s on an H100.
DEFAULT_DECODE_TUNING = "off"
QUANTIZED_DECODE_TUNING = "gpt-fast"


def default_decode_tuning(products_by_inductor: bool) -> str:
    """The decode tuning a run gets when it names none: QUANTIZED_DECODE_TUNING where Inductor generates the quantized
    weights' products (torchao's default kernel), DEFAULT_DECODE_TUNING otherwise."""
    return QUANTIZED_DECODE_TUNING if products_by_inductor else DEFAULT_DECODE_TUNING


@dataclass
class GenerationSpec:
    """What a generation workload declares: vocabulary, request lengths, the model's context, the built-in draft."""

    vocab: int
    prompt_lengths: tuple[int, int]
    output_lengths: tuple[int, int]
    eval_sequences: torch.Tensor  # fixed synthetic token sequences: the quality gate's perplexity set
    context_limit: Optional[int] = None  # positions the model supports, when known
    builtin_draft: Optional[Callable[[], nn.Module]] = None  # the draft trained with the target, if any
    builtin_decoder: bool = False  # the model is perflab's Decoder (static cache and compiled decode apply)
    # the decode step's Inductor settings by name (DECODE_TUNINGS); None: default_decode_tuning for the weights' kernel
    decode_tuning: Optional[str] = None
    decode_graphs: str = "perflab"  # who captures a compile mode's CUDA graphs: perflab (decode_graph.py) or inductor
    # The workload's own generation loop, `generate_fn(input_ids, max_new_tokens)` (e.g. a wrapper of transformers'
    # model.generate): when given, perflab times it whole (the loop path, perflab/generation/loop_timing.py) instead
    # of running its own decode loop over the model's step. It must make exactly max_new_tokens tokens per sequence.
    generate_fn: Optional[Callable[[torch.Tensor, int], Any]] = None


def parse_lengths(text: str, name: str) -> tuple[int, int]:
    """'128' -> (128, 128); '64-256' -> (64, 256)."""
    low, sep, high = str(text).partition("-")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise PerflabError(f"--option {name} expects a number or a range like 64-256, got {text!r}") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise PerflabError(f"--option {name}: lengths must be positive and the range low-high ascending, got {text!r}")
    return bounds


class Requests(Dataset):
    """Item i: (prompt tokens at the longest prompt length, (prompt length, output length))."""

    def __init__(self, vocab: int, prompt_lengths: tuple[int, int], output_lengths: tuple[int, int], seed: int,
                 pool: int = 64, length: int = 100_000):
        gen = torch.Generator().manual_seed(seed)
        self.prompts = SyntheticLanguage(vocab).sample(pool, prompt_lengths[1], seed=seed + 7)
        # Python ints: reading a length must not show up as a tensor .item() in a profile
        self.prompt_len = torch.randint(prompt_lengths[0], prompt_lengths[1] + 1, (pool,), generator=gen).tolist()
        self.output_len = torch.randint(output_lengths[0], output_lengths[1] + 1, (pool,), generator=gen).tolist()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, tuple[int, int]]:
        row = index % len(self.prompts)
        return self.prompts[row], (self.prompt_len[row], self.output_len[row])


def collate_requests(items: list[tuple[torch.Tensor, tuple[int, int]]]) -> tuple[torch.Tensor, int]:
    """(prompts (batch, L), output length) with L and the output length of the first request."""
    prompt_len, output_len = items[0][1]
    return torch.stack([tokens[:prompt_len] for tokens, _ in items]), output_len


def request_shape(batch: Any) -> tuple[torch.Tensor, int]:
    """The (prompts, output length) of a request batch."""
    prompt, output_len = batch
    return prompt, int(output_len)

"""A Hugging Face transformers causal LM generating through perflab: TTFT, TPOT, speculative decoding.

    perflab run --workload examples/hf_causal_lm.py --mode infer
    perflab run --workload examples/hf_causal_lm.py --mode infer --speculative 3 \
        --draft examples/hf_causal_lm.py:build_draft

A GPT-2 (GPT2LMHeadModel) built from a GPT2Config with random weights (nothing is downloaded): GPT-2 small's
shape on a GPU, a tiny one on a CPU. perflab calls it the transformers way, `model(input_ids=...,
attention_mask=..., past_key_values=..., use_cache=True)`, keeps its own cache object between tokens, and rolls
it back (`crop`) past rejected drafts. The draft is a one-layer GPT-2 over the same vocabulary. Any
AutoModelForCausalLM.from_pretrained(...) model can take the target's place. Needs `pip install 'perflab[models]'`.
"""
import torch

import perflab
from perflab.generation import causal_lm_workload
from perflab.workloads.settings import ByDevice, resolve_settings, setting

OPTIONS = (  # by device: GPT-2 small on a GPU, seconds per run on a CPU
    setting("layers", int, "transformer blocks", ByDevice(12, 2), minimum=1),
    setting("hidden", int, "hidden size (a multiple of heads)", ByDevice(768, 64), minimum=1),
    setting("heads", int, "attention heads", ByDevice(12, 4), minimum=1),
    setting("vocab", int, "vocabulary size", ByDevice(50257, 512), minimum=2),
    setting("context", int, "positions the model holds", ByDevice(1024, 256), minimum=16),
    setting("prompt_len", str, "prompt length: a number or a range low-high", ByDevice("128", "16-32")),
    setting("output_len", str, "tokens generated per request: a number or a range", ByDevice("128", "16")),
)


def _gpt2(layers: int, hidden: int, heads: int, vocab: int, context: int, seed: int):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise perflab.PerflabError("examples/hf_causal_lm.py needs transformers: "
                                   "pip install 'perflab[models]'") from None
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=context)
    return GPT2LMHeadModel(config)


def build(cfg) -> perflab.Workload:
    sizes = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    model = _gpt2(sizes["layers"], sizes["hidden"], sizes["heads"], sizes["vocab"], sizes["context"], cfg.seed)
    return causal_lm_workload(model, sizes["vocab"], cfg, name="hf-gpt2", prompt_len=sizes["prompt_len"],
                              output_len=sizes["output_len"], context_limit=sizes["context"],
                              draft=lambda: build_draft(cfg), description="transformers GPT2LMHeadModel generating")


def build_draft(cfg) -> torch.nn.Module:
    """The speculative draft: one block, a quarter of the width (at least 32), the target's vocabulary."""
    sizes = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    hidden = max(32, sizes["hidden"] // 4 // sizes["heads"] * sizes["heads"])
    return _gpt2(1, hidden, sizes["heads"], sizes["vocab"], sizes["context"], cfg.seed + 1)

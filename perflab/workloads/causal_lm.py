"""Your own causal LM as a generation workload: `causal_lm_workload(model, vocab_size, cfg)` in your build(cfg).

The model takes the transformers calling convention: `model(input_ids=..., attention_mask=...,
past_key_values=..., use_cache=True)` returning logits and past_key_values (a ModelOutput, a dict or a
(logits, past) tuple). A transformers AutoModelForCausalLM works as is; transformers itself is not needed.
perflab times the model's step through its own decode loop (the step path), or, given `generate_fn`, your own
generation loop called whole (the loop path, perflab/generation/loop_timing.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from perflab.models.language import SyntheticLanguage
from perflab.workloads.generation import GenerationSpec
from perflab.workloads.generation import Requests, collate_requests, parse_lengths
from perflab.workloads.base import Workload


def causal_lm_workload(model: nn.Module, vocab_size: int, cfg, name: str = "causal-lm",
                       prompt_len: str = "16-32", output_len: str = "16", context_limit: Optional[int] = None,
                       draft: Optional[Callable[[], nn.Module]] = None, description: str = "",
                       generate_fn: Optional[Callable[[torch.Tensor, int], Any]] = None) -> Workload:
    """A Workload that generates with `model`: prompts from the synthetic language over its vocabulary.

    `--option prompt_len=...` / `output_len=...` override the lengths given here; `draft` (a function returning
    a causal LM with the same vocabulary) is the default draft of --speculative. `generate_fn(input_ids,
    max_new_tokens)`, your own generation loop over `model` (e.g. one calling `model.generate`), makes perflab time
    that loop whole instead of its own decode loop over the model's step (docs/generate.md, "Your own loop").
    """
    opts = cfg.workload_options
    prompt_lengths = parse_lengths(opts.get("prompt_len", prompt_len), "prompt_len")
    output_lengths = parse_lengths(opts.get("output_len", output_len), "output_len")
    spec = GenerationSpec(vocab=vocab_size, prompt_lengths=prompt_lengths, output_lengths=output_lengths,
                          eval_sequences=SyntheticLanguage(vocab_size).sample(4, 64, seed=99),
                          context_limit=context_limit, builtin_draft=draft, generate_fn=generate_fn)
    return Workload(name=name, model=model.eval(), dataset=Requests(vocab_size, prompt_lengths, output_lengths,
                                                                    seed=cfg.seed),
                    collate_fn=collate_requests, description=description or f"{name}: causal LM generation",
                    generation=spec, info={"vocab": vocab_size, "prompt_len": prompt_lengths,
                                           "output_len": output_lengths})

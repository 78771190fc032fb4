"""Your own causal LM as a generation workload: `causal_lm_workload(model, vocab_size, cfg)` in your build(cfg).

The model takes the transformers calling convention: `model(input_ids=..., attention_mask=...,
past_key_values=..., use_cache=True)` returning logits and past_key_values (a ModelOutput, a dict or a
(logits, past) tuple). A transformers AutoModelForCausalLM works as is; transformers itself is not needed.
"""
from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from perflab.models.language import SyntheticLanguage
from perflab.workloads.generation import GenerationSpec
from perflab.workloads.generation import Requests, collate_requests, parse_lengths
from perflab.workloads.base import Workload


def causal_lm_workload(model: nn.Module, vocab_size: int, cfg, name: str = "causal-lm",
                       prompt_len: str = "16-32", output_len: str = "16", context_limit: Optional[int] = None,
                       draft: Optional[Callable[[], nn.Module]] = None, description: str = "") -> Workload:
    """A Workload that generates with `model`: prompts from the synthetic language over its vocabulary.

    `--option prompt_len=...` / `output_len=...` override the lengths given here; `draft` (a function returning
    a causal LM with the same vocabulary) is the default draft of --speculative.
    """
    opts = cfg.workload_options
    prompt_lengths = parse_lengths(opts.get("prompt_len", prompt_len), "prompt_len")
    output_lengths = parse_lengths(opts.get("output_len", output_len), "output_len")
    spec = GenerationSpec(vocab=vocab_size, prompt_lengths=prompt_lengths, output_lengths=output_lengths,
                          eval_sequences=SyntheticLanguage(vocab_size).sample(4, 64, seed=99),
                          context_limit=context_limit, builtin_draft=draft)
    return Workload(name=name, model=model.eval(), dataset=Requests(vocab_size, prompt_lengths, output_lengths,
                                                                    seed=cfg.seed),
                    collate_fn=collate_requests, description=description or f"{name}: causal LM generation",
                    generation=spec, info={"vocab": vocab_size, "prompt_len": prompt_lengths,
                                           "output_len": output_lengths})

"""The loop path: a workload's own generation loop (GenerationSpec.generate_fn, e.g. transformers' model.generate)
timed whole, so that "the same model through perflab" measures what its user runs.

perflab cannot see inside such a loop (its tokens come out together when it returns), so per request batch it calls
the loop twice, each call with the device synchronised before it starts and after it returns (the host clock in
between, as one times any black-box call): `generate_fn(prompt, N)`, then `generate_fn(prompt, 1)`. Then

    TTFT                          = the one-token call (prefill and the loop's set-up)
    time per output token (TPOT)  = (the N-token call - the one-token call) / (N - 1)
    end-to-end latency            = the N-token call
    output tokens/s               = batch x N / the N-token calls' time, per trial, median over trials

so the per-token time holds everything the loop does per token: the model's step and the loop's own work between
steps (logits processors, stopping criteria, cache bookkeeping). The N-token call goes first: a loop that sizes its
cache by the request (generate's static cache) then allocates the larger one first and reuses it. The figures go
into the same record as the step path's (generation/metrics.summarize_requests), with `timed_path` "loop"; the
inter-token latency is left out, since no gap between two tokens is observed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from perflab.errors import PerflabError
from perflab.generation.metrics import BandwidthBound, RequestTiming, chosen_levers, summarize_requests
from perflab.hooks import StepHook
from perflab.models.kv_cache import kv_cache_bytes
from perflab.results.metrics import Generation
from perflab.workloads.generation import request_shape

LOOP_METHOD = ("the workload's own generation loop called whole per request batch, device synchronised before and "
               "after each call: TTFT = a call for 1 token; TPOT = (the call for N tokens - the call for 1) / (N - 1); "
               "tokens/s = tokens of the N-token calls / their time")


@dataclass
class LoopSample:
    """One request batch through the loop: its shape and how long its two whole calls took."""

    batch: int
    prompt_len: int
    new_tokens: int
    first_token_ms: float  # generate_fn(prompt, 1)
    whole_ms: float  # generate_fn(prompt, new_tokens)


def loop_request(sample: LoopSample) -> RequestTiming:
    """The request as the step path records one: the first token at the one-token call's time, the remaining N - 1
    at the N-token call's end, so TPOT = (whole - first) / (N - 1) and the end-to-end latency = the whole call."""
    return RequestTiming(sample.batch, sample.prompt_len, [sample.first_token_ms, sample.whole_ms],
                         [1, sample.new_tokens - 1])


def trial_generating_walls(samples: list[LoopSample], steps_per_trial: list[int]) -> list[tuple[int, float]]:
    """(request batches, seconds in N-token calls) per trial: the tokens/s of a trial counts the time spent making
    them, not the one-token calls made to time the first token."""
    walls, start = [], 0
    for steps in steps_per_trial:
        chunk = samples[start:start + steps]
        start += steps
        walls.append((len(chunk), sum(sample.whole_ms for sample in chunk) / 1e3))
    return walls


def summarize_loop(samples: list[LoopSample], steps_per_trial: list[int], bound: Optional[BandwidthBound],
                   slo: dict[str, float]) -> Generation:
    """The generation record of a loop-path run: the step path's figures, from whole calls."""
    requests = [loop_request(sample) for sample in samples]
    generation = Generation.from_dict(summarize_requests(requests, trial_generating_walls(samples, steps_per_trial),
                                                         bound, slo))
    generation.itl_ms = None  # the loop's tokens come out together: no gap between two of them is observed
    generation.timed_path = "loop"
    return generation


def output_positions(produced: Any) -> Optional[int]:
    """Positions per sequence in a loop's output: of a (batch, positions) tensor of token ids, or of a result with
    `.sequences` (transformers' GenerateOutput); None for anything else (nothing to check)."""
    sequences = getattr(produced, "sequences", produced)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        return None
    return sequences.shape[1]


class GenerationLoopStep:
    """One request batch per timed step: the workload's own loop, called whole for N tokens and then for one.

    `model_step` is the step path over the same model (a GenerationStep): the quality gate judges the model's
    numbers through it (`generate`, `target`), since a loop timed whole gives no logits to compare."""

    def __init__(self, generate_fn: Callable[[torch.Tensor, int], Any], device: torch.device, model_step: Any):
        self.generate_fn, self.device, self.model_step = generate_fn, device, model_step
        self.samples: list[LoopSample] = []

    def __call__(self, plan, batch: Any, timer, mark: type) -> None:
        prompt, new_tokens = request_shape(batch)
        with timer.phase("generate"), mark("generate"):
            whole_ms = self.timed_call(prompt, new_tokens)
        with timer.phase("first_token"), mark("first_token"):
            first_token_ms = self.timed_call(prompt, 1)
        self.samples.append(LoopSample(prompt.shape[0], prompt.shape[1], new_tokens, first_token_ms, whole_ms))

    def timed_call(self, prompt: torch.Tensor, new_tokens: int) -> float:
        """Milliseconds of one whole call of the loop, the device idle at its start and synchronised at its end."""
        synchronize(self.device)
        began = time.perf_counter()
        produced = self.generate_fn(prompt, new_tokens)
        synchronize(self.device)
        elapsed_ms = (time.perf_counter() - began) * 1e3
        check_made_every_token(produced, prompt.shape[1], new_tokens)
        return elapsed_ms

    def generate(self, prompt: torch.Tensor, new_tokens: int, *timing) -> torch.Tensor:
        """The model's greedy continuation through the step path (the quality gate's reference)."""
        return self.model_step.generate(prompt, new_tokens, *timing)

    @property
    def target(self) -> Any:
        return self.model_step.target

    def close(self) -> None:
        self.model_step.close()


def check_made_every_token(produced: Any, prompt_len: int, new_tokens: int) -> None:
    """A loop that stops early (an end-of-sequence token) would make the time per token wrong: refuse it."""
    positions = output_positions(produced)
    if positions is None or positions in (prompt_len + new_tokens, new_tokens):
        return
    raise PerflabError(f"the workload's generate_fn returned {positions} positions per sequence for a prompt of "
                       f"{prompt_len} and max_new_tokens={new_tokens} (expected {prompt_len + new_tokens}, or "
                       f"{new_tokens} without the prompt): a loop that stops early (an end-of-sequence token) makes "
                       "the time per token wrong; make it produce exactly max_new_tokens (transformers: "
                       "min_new_tokens=max_new_tokens)")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_loop_lengths(output_lengths: tuple[int, int]) -> None:
    """The per-token time needs two calls of different lengths: every request must make at least 2 tokens."""
    if output_lengths[0] < 2:
        raise PerflabError(f"the workload times its own generation loop (generate_fn), whose time per token is "
                           f"(a call for N tokens - a call for 1) / (N - 1): output lengths start at "
                           f"{output_lengths[0]}; use --option output_len=2 or more")


def config_kv_bytes_per_position(model: nn.Module, batch: int, dtype: torch.dtype) -> Optional[int]:
    """Keys + values of one position for the batch, every layer, from a transformers-style config (layers, key/value
    heads, head dim); None when the model has no such config. The loop's cache lives inside the loop, out of reach."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(layers, int) or not isinstance(heads, int):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    if not head_dim:
        return None
    return kv_cache_bytes(layers, batch, kv_heads, head_dim, 1, dtype)


class GenerationLoopHook(StepHook):
    """Forgets the warm-up's calls before the timed trials; turns the timed ones into result.metrics.generation."""

    def __init__(self, step: GenerationLoopStep, bound: BandwidthBound, slo: dict[str, float], cfg):
        self.step, self.bound, self.slo, self.cfg = step, bound, slo, cfg

    def __enter__(self) -> "GenerationLoopHook":
        self.step.samples.clear()
        return self

    def finish(self, result) -> None:
        generation = summarize_loop(self.step.samples, [trial.steps for trial in result.trials], self.bound,
                                    self.slo)
        generation.levers = chosen_levers(self.cfg)
        result.metrics.generation = generation
        result.timing["generation"] = LOOP_METHOD

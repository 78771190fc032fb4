"""How a generation workload plugs into the harness: its declaration, the levers' choices, and the timed step.

A workload that generates declares a GenerationSpec (Workload.generation). build_plan gives the StepPlan a
GenerationSettings that the levers fill in (static cache, compile mode, quantization, speculative K); once every
lever has spoken, `prepare_generation` builds the step in one fixed order: weights to their stored dtype,
quantization, caches (and the draft), compiled decode. The step (GenerationStep) runs one request batch per
timed-loop step: the prefill and every decode step, timed per token by a TokenClock; a StepHook turns the
clock's records into result.metrics.generation. A workload that declares its own loop (GenerationSpec.generate_fn)
is timed through that loop instead, whole (loop_timing.py: the loop path).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from perflab.errors import PerflabError
from perflab.generation.decode import generate_greedy
from perflab.config import parse_slo
from perflab.generation.metrics import (BandwidthBound, TokenClock, chosen_levers, summarize_requests,
                                      weight_bytes_per_step)
from perflab.workloads.generation import request_shape
from perflab.generation.session import open_session
from perflab.generation.speculative import SpeculativeStats, generate_speculative
from perflab.hooks import StepHook
from perflab.models.outputs import output_field
from perflab.workloads.generation import GenerationSpec, default_decode_tuning
from perflab.results.metrics import DecodeCompile, Generation, Speculative
from perflab.generation.quantize import KERNEL_WORDS, kernel_note, quantize_weights, resolved_kernel
from perflab.workloads.plugin import call_user_build, load_user_build
from perflab.models.decoder import Decoder
from perflab.calibrate import memory_bandwidth, peak_tflops
from perflab.models.kv_cache import kv_cache_bytes
from perflab.generation.compiled_decode import cudagraph_skips
from perflab.generation.loop_timing import (GenerationLoopHook, GenerationLoopStep, check_loop_lengths,
                                            config_kv_bytes_per_position)


@dataclass
class GenerationSettings:
    """What the generation levers chose."""

    static_cache: bool = False
    compile_mode: Optional[str] = None
    quantize: Optional[str] = None
    speculative_k: Optional[int] = None


@dataclass
class GenerationStep:
    """One request batch per call: prefill, then decode (plain greedy or speculative), timed per token."""

    target: Any  # session
    clock: TokenClock
    draft: Any = None  # session, with speculative decoding
    k: Optional[int] = None
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)

    def __call__(self, plan, batch: Any, timer, mark: type) -> None:
        prompt, new_tokens = request_shape(batch)
        self.generate(prompt, new_tokens, self.clock, timer, mark)

    def generate(self, prompt: torch.Tensor, new_tokens: int, clock: Optional[TokenClock] = None, *timing) -> torch.Tensor:
        """The greedy continuation of `prompt`, `new_tokens` long (speculative when a draft is set)."""
        if self.k:
            return generate_speculative(self.target, self.draft, prompt, new_tokens, self.k, self.stats, clock, *timing)
        return generate_greedy(self.target, prompt, new_tokens, clock, *timing)

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()


def attach_settings(plan) -> None:
    """Give a generation workload's plan the settings its levers fill in (before the levers run)."""
    if plan.workload.generation is not None:
        if plan.mode != "infer":
            raise PerflabError(f"{plan.workload.name} generates tokens: run it with --mode infer")
        plan.generation = GenerationSettings()


def prepare_generation(plan, cfg) -> None:
    """Build the generation step from the levers' settings (after every lever has run)."""
    spec: GenerationSpec = plan.workload.generation
    settings: GenerationSettings = plan.generation
    dtype = plan.autocast_dtype or torch.float32
    model = plan.model.to(dtype)  # generation stores weights in the run's precision: autocast would re-cast them
    plan.autocast_dtype = None
    if plan.levers and dtype != torch.float32:
        plan.notes.append(f"generation: weights and KV cache stored in {str(dtype).removeprefix('torch.')} "
                          "(no autocast)")
    kernel = None
    if settings.quantize:
        kernel, why = resolved_kernel(settings.quantize, cfg.quantize_kernel, plan.device)
        mixed = kernel_note(model, settings.quantize, kernel)  # read before quantizing: the layers' own types
        quantize_weights(model, settings.quantize, kernel)
        plan.notes.append(f"{settings.quantize} weights through {KERNEL_WORDS[kernel]}: {why}")
        if mixed:
            plan.notes.append(mixed)
    tuning = spec.decode_tuning or default_decode_tuning(products_by_inductor=kernel == "torchao")
    k = settings.speculative_k
    positions = spec.prompt_lengths[1] + spec.output_lengths[1] + (k + 1 if k else 0)
    if spec.context_limit is not None and positions > spec.context_limit:
        raise PerflabError(f"requests need up to {positions} positions, the model has {spec.context_limit}: "
                           "lower --option prompt_len / output_len")

    def session(of: nn.Module, largest_compiled: int = 1):
        return open_session(of, plan.batch_size, positions, plan.device, dtype, settings.static_cache,
                            settings.compile_mode, largest_compiled, tuning, cfg.sdpa,
                            spec.decode_graphs)
    if spec.generate_fn is not None:
        check_loop_lengths(spec.output_lengths)
    step = GenerationStep(target=session(model, largest_compiled=k + 1 if k else 1), clock=TokenClock(plan.device))
    if k:
        draft = load_draft(cfg, spec, plan.device, dtype)
        step.draft, step.k = session(draft), k
    plan.cleanups.append(step.close)
    bound, slo = bandwidth_bound(model, spec, plan, dtype), parse_slo(cfg.slo)
    if spec.generate_fn is not None:
        time_own_loop(plan, spec, step, model, dtype, bound, slo, cfg)
        return
    plan.custom_step = step
    plan.hooks.append(GenerationHook(step, bound, slo, cfg))
    if k:
        plan.notes.append("speculative decoding reads the accepted count on the host once per round")


def time_own_loop(plan, spec: GenerationSpec, step: GenerationStep, model: nn.Module, dtype: torch.dtype,
                  bound: BandwidthBound, slo: dict[str, float], cfg) -> None:
    """The loop path: the workload's generate_fn timed whole (loop_timing.py); the step path stays behind it for the
    quality gate. The loop's cache lives inside it, so the bound's KV bytes come from the model's config."""
    if not bound.kv_bytes_per_position:
        kv = config_kv_bytes_per_position(model, plan.batch_size, dtype)
        bound.kv_bytes_per_position = kv or 0
        bound.notes = ["KV cache bytes from the model's config (layers x key/value heads x head dim)" if kv else
                       "KV cache bytes unknown (no transformers-style config): the bound counts the weights alone"]
    loop = GenerationLoopStep(spec.generate_fn, plan.device, step)
    plan.custom_step = loop
    plan.hooks.append(GenerationLoopHook(loop, bound, slo, cfg))
    plan.notes.append("generation: the workload's own loop (generate_fn) timed whole, two calls per request batch "
                      "(N tokens, then 1), the device synchronised around each")


def load_draft(cfg, spec: GenerationSpec, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The draft for --speculative: the user's (--draft SPEC) or the workload's built-in one; same vocabulary."""
    if cfg.draft:
        draft = call_user_build(cfg.draft, load_user_build(cfg.draft), cfg)
        if not isinstance(draft, nn.Module):
            raise PerflabError(f"--draft {cfg.draft} returned {type(draft).__name__}, expected a torch.nn.Module "
                               "(a causal LM)")
        origin = f"--draft {cfg.draft}"
    elif spec.builtin_draft is not None:
        draft, origin = spec.builtin_draft(), "the built-in draft"
    else:
        raise PerflabError("--speculative needs a draft model for this workload: add --draft path/file.py:build_draft")
    draft = draft.to(device, dtype).eval()
    vocab = probe_vocab(draft, device)
    if vocab != spec.vocab:
        raise PerflabError(f"{origin} has a vocabulary of {vocab} tokens and the target {spec.vocab}: a draft must "
                           "share the target's vocabulary")
    return draft


def probe_vocab(model: nn.Module, device: torch.device) -> int:
    """The vocabulary size a causal LM predicts over (the last dimension of its logits for one token)."""
    tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.inference_mode():
        if isinstance(model, Decoder):
            return model(tokens).shape[-1]
        output = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False)
        return output_field(output, "logits", 0).shape[-1]


def bandwidth_bound(model: nn.Module, spec: GenerationSpec, plan, dtype: torch.dtype) -> BandwidthBound:
    """What one decode step must read (weights + KV cache) and the device bandwidth to read it with."""
    gbps, source = memory_bandwidth(plan.device)
    kv = kv_bytes_per_position(model, plan.batch_size, dtype)
    notes = [] if kv is not None else ["KV cache bytes measured from the first request's past_key_values"]
    matmul_weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    peak, _ = peak_tflops(plan.device, {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32"))
    return BandwidthBound(weight_bytes_per_step(model, plan.batch_size), kv or 0, gbps, source, notes,
                          matmul_flops_per_step=2.0 * matmul_weights * plan.batch_size, peak_tflops=peak)


def kv_bytes_per_position(model: nn.Module, batch: int, dtype: torch.dtype) -> Optional[int]:
    """Keys + values of one position for the batch, all layers; None when only a first request can tell."""
    if isinstance(model, Decoder):
        size = model.size
        return kv_cache_bytes(size.layers, batch, size.kv_heads, size.head_dim, 1, dtype)
    return None


def tensor_bytes(value: Any, depth: int = 0) -> int:
    """Bytes of every tensor inside a (nested) past_key_values: tuples, lists or a Cache object's attributes."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if depth > 4:
        return 0
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(item, depth + 1) for item in value)
    if hasattr(value, "__dict__"):
        return sum(tensor_bytes(item, depth + 1) for item in vars(value).values())
    return 0


def cache_positions(past: Any, length: int) -> int:
    """Positions a past_key_values holds room for: a static cache (transformers' StaticCache) its whole capacity,
    allocated up front; otherwise the `length` positions filled so far."""
    for name in ("get_max_cache_shape", "get_max_length"):  # transformers <= 5.17, later
        method = getattr(past, name, None)
        try:
            capacity = method() if callable(method) else None
        except Exception:  # versions differ in what a cache without layers answers
            capacity = None
        if isinstance(capacity, int) and capacity > 0:
            return capacity
    return max(length, 1)


class GenerationHook(StepHook):
    """Clears the clock before the timed trials; turns its records into result.metrics.generation at the end."""

    def __init__(self, step: GenerationStep, bound: BandwidthBound, slo: dict[str, float], cfg):
        self.step, self.bound, self.slo, self.cfg = step, bound, slo, cfg
        self.skips_before = cudagraph_skips()  # the decode step compiles after this, in warm-up

    def __enter__(self) -> "GenerationHook":
        self.step.clock.clear()
        self.step.stats.reset()
        return self

    def after_step(self, plan, timer, step: int) -> None:
        if not self.bound.kv_bytes_per_position and getattr(self.step.target, "past", None) is not None:
            session = self.step.target  # a transformers-convention model: measure its cache once
            self.bound.kv_bytes_per_position = tensor_bytes(session.past) // cache_positions(session.past,
                                                                                             session.length)

    def finish(self, result) -> None:
        requests = self.step.clock.timings()
        trial_walls = [(trial.steps, trial.wall_s) for trial in result.trials]
        generation = Generation.from_dict(summarize_requests(requests, trial_walls, self.bound, self.slo))
        generation.timed_path = "step"
        generation.levers = chosen_levers(self.cfg)
        generation.decode_compile = DecodeCompile.from_dict(self.decode_compile(result))
        if self.step.k:
            generation.speculative = Speculative.from_dict(self.step.stats.summary(self.step.k))
            gate = result.quality.metrics if result.quality is not None else None
            if getattr(gate, "speculative_speedup", None) is not None:  # only a generation gate's figures have it
                generation.speculative.speedup_vs_plain = gate.speculative_speedup
                generation.speculative.speedup_method = (
                    f"quality gate: plain greedy vs speculative with the same target and levers on its "
                    f"{result.quality.batches} request batches (wall clock, after one untimed request each)")
        result.metrics.generation = generation  # the pipeline adds its decode regime (diagnose/decode.py)

    def decode_compile(self, result) -> Optional[dict[str, Any]]:
        """How the decode step was compiled (mode, Inductor options, SDPA backend, who captured its CUDA graphs)
        and, with Inductor's graphs, how many compiled graphs ran without them (0: the whole step replays as one
        graph); with perflab's, the token counts it captured."""
        target = self.step.target
        settings = getattr(target, "compile_settings", None)
        if settings is None:
            return None
        inductor = settings["graphs"] == "inductor"
        captured = getattr(target, "captured", None)
        return {**settings, "cudagraph_skips": cudagraph_skips() - self.skips_before if inductor else None,
                "captured_lengths": captured.lengths if captured is not None else None}

"""Sessions: one request batch's decoding state over a model, whatever its calling convention.

A session starts with a prompt (the prefill), then extends by a few tokens at a time (decode, or speculative
verification), and can roll back (rejected drafts). Two kinds:

- DecoderSession: the built-in Decoder with a dynamic or static KV cache; with a static cache the small fixed-shape
  extensions (one token, or K+1 when verifying drafts) may run through torch.compile (reduce-overhead: CUDA graphs).
- CausalLMSession: any model with the transformers calling convention, `model(input_ids=..., attention_mask=...,
  past_key_values=..., use_cache=True)` returning logits and past_key_values (a ModelOutput, dict or tuple).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import nn

from perflab.errors import PerflabError
from perflab.generation.compiled_decode import compile_decode, decode_attention, wants_graphs
from perflab.models.outputs import output_field
from perflab.workloads.generation import DEFAULT_DECODE_TUNING
from perflab.generation.decode_graph import CapturedDecode
from perflab.models.decoder import Decoder


class DecoderSession:
    """Prefill and decode through the built-in Decoder and its KV caches."""

    def __init__(self, model: Decoder, batch: int, max_seq: int, static: bool, device: torch.device,
                 dtype: torch.dtype, compile_mode: Optional[str] = None, largest_compiled: int = 1,
                 tuning: str = DEFAULT_DECODE_TUNING, sdpa: str = "auto", graphs: str = "perflab"):
        """`tuning`: the decode step's Inductor settings by name (perflab.workloads.generation.DECODE_TUNINGS). `graphs`: who
        captures the CUDA graphs a compile mode asks for: perflab (decode_graph.py) or inductor."""
        if max_seq > model.size.max_seq:
            raise PerflabError(f"requests need {max_seq} positions but the decoder has {model.size.max_seq}: use "
                               "shorter prompt_len/output_len options")
        self.model, self.batch, self.max_seq, self.static = model, batch, max_seq, static
        self.length = 0
        model.attach_caches(static, batch, max_seq, dtype, device)
        self.device = device
        # Extensions up to this many tokens (1, or K+1 when verifying drafts) run compiled, one graph per length;
        # prefills stay eager: their lengths vary by request and would each compile a graph.
        self.largest_compiled = largest_compiled
        self.compiled = None
        self.captured: Optional[CapturedDecode] = None
        self.compile_settings: Optional[dict] = None
        self.attention: Callable[[], ContextManager] = contextlib.nullcontext
        if compile_mode is not None:
            if not static:
                raise PerflabError("compiling the decode step needs fixed shapes: add --kv-cache static")
            graphs_by = graphs if device.type == "cuda" and wants_graphs(compile_mode) else None
            capture = graphs_by == "perflab"
            self.compiled, options = compile_decode(self._step, compile_mode, tuning, inductor_graphs=not capture)
            self.attention, attention_name = decode_attention(tuning, sdpa)
            if capture:
                self.captured = CapturedDecode(self.compiled, self.attention)
            self.compile_settings = {"mode": compile_mode, "decode_tuning": tuning,
                                     "inductor_options": options, "decode_sdpa": attention_name,
                                     "graphs": graphs_by}

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # row p of the static mask: a query at position p sees every position up to p, nothing after (one row per
        # new token: (1, 1, T, max_seq), never the whole table)
        rows = self.model.static_mask_rows
        mask = rows[positions].view(1, 1, tokens.shape[1], self.max_seq) if self.static else None
        return self.model(tokens, positions, mask)

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the greedy next token of every position: the argmax runs inside the compiled step (and its
        CUDA graph), so a greedy decode launches nothing per token outside it but the inputs' copies."""
        logits = self._forward(tokens, positions)
        return logits, logits.argmax(dim=-1)

    def start(self, prompt: torch.Tensor) -> torch.Tensor:
        """Forget the previous request and run the prompt; logits (batch, prompt length, vocab)."""
        for cache in self.model.caches():
            cache.reset()
        self.length = 0
        return self._extend(prompt, compiled=False)[0]

    def extend(self, tokens: torch.Tensor, compiled: bool = True) -> torch.Tensor:
        """Run `tokens` (batch, T) after everything cached; logits (batch, T, vocab). From the compiled step
        (CUDA graphs) they are copied out of the graph's memory, so they stay valid."""
        return self._extend(tokens, compiled)[0]

    def extend_greedy(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run `tokens` (batch, T) after everything cached; the greedy next token after each: (batch, T)."""
        logits, chosen = self._extend(tokens, compiled=True, keep_logits=False)
        return chosen if chosen is not None else logits.argmax(dim=-1)

    def _extend(self, tokens: torch.Tensor, compiled: bool, keep_logits: bool = True
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Logits and (from the compiled step) the greedy tokens. A compiled step's outputs are its CUDA graphs'
        buffers, rewritten by the next replay, so they are copied out; the logits only when `keep_logits` (a greedy
        decode reads the tokens alone: one copy kernel less per step)."""
        count = tokens.shape[1]
        if self.length + count > self.max_seq:
            raise PerflabError(f"a request reached {self.length + count} positions, more than the {self.max_seq} "
                               "the session was sized for")
        chosen = None
        if compiled and self.captured is not None and count <= self.largest_compiled:
            logits, chosen = self.captured(tokens, self.length)
            logits, chosen = (logits.clone() if keep_logits else logits), chosen.clone()
            self.length += count
            return logits, chosen
        # a fresh tensor (not a view of a table): a compiled step's inputs stay aligned and shaped alike; made on
        # the device (a fill kernel), never copied from the host
        positions = torch.arange(self.length, self.length + count, device=self.device)
        if compiled and self.compiled is not None and count <= self.largest_compiled:
            # row-major strides whatever the tokens were sliced from: Dynamo guards on strides, so a (1, 1) slice of
            # a (1, K) tensor would otherwise compile another graph (copied only when they differ)
            if tokens.stride() != (count, 1):
                tokens = tokens.clone(memory_format=torch.contiguous_format)
            with self.attention():
                logits, chosen = self.compiled(tokens, positions)
            # CUDA graphs (reduce-overhead) hand back their own static buffers, overwritten by the next replay;
            # callers keep tokens (and the quality gate logits) across steps, so each step's outputs are copied
            # out (small copies: one token and, when kept, one row of logits per sequence; measured on the H100,
            # keeping them un-copied raised "accessing tensor output of CUDAGraphs that has been overwritten")
            logits, chosen = (logits.clone() if keep_logits else logits), chosen.clone()
        elif self.static or self.length == 0 or count == 1:
            logits = self._forward(tokens, positions)
        else:  # several new tokens after a dynamic cache: each sees the cache and the new tokens before it
            seen = torch.arange(self.length + count, device=tokens.device)
            mask = (seen[None, :] <= positions[:, None]).view(1, 1, count, -1)
            logits = self.model(tokens, positions, mask)
        self.length += count
        return logits, chosen

    def truncate(self, length: int) -> None:
        """Roll back to the first `length` positions."""
        for cache in self.model.caches():
            cache.truncate(length)
        self.length = length

    def close(self) -> None:
        if self.captured is not None:
            self.captured.close()
        self.model.detach_caches()
        if self.compiled is not None:
            # Every session compiles the same method, so Dynamo keeps one entry per session on one code object
            # and falls back to eager past its recompile limit: release them with the session.
            torch._dynamo.reset()


class CausalLMSession:
    """Prefill and decode through a model with the transformers calling convention (its own cache)."""

    def __init__(self, model: nn.Module, batch: int, max_seq: int, device: torch.device):
        self.model, self.batch = model, batch
        self.length = 0
        self.past: Any = None
        self.attention_mask = torch.ones(batch, max_seq, dtype=torch.long, device=device)

    def start(self, prompt: torch.Tensor) -> torch.Tensor:
        self.past, self.length = None, 0
        return self.extend(prompt)

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        count = tokens.shape[1]
        output = self.model(input_ids=tokens, attention_mask=self.attention_mask[:, :self.length + count],
                            past_key_values=self.past, use_cache=True)
        logits, self.past = output_field(output, "logits", 0), output_field(output, "past_key_values", 1)
        self.length += count
        return logits

    def extend_greedy(self, tokens: torch.Tensor) -> torch.Tensor:
        """The greedy next token after each of `tokens`: (batch, T)."""
        return self.extend(tokens).argmax(dim=-1)

    def truncate(self, length: int) -> None:
        self.past = crop_past(self.past, length)
        self.length = length

    def close(self) -> None:
        self.past = None


def crop_past(past: Any, length: int) -> Any:
    """Keep the first `length` positions of a cache: a transformers Cache (crop) or nested (key, value) tuples."""
    if past is None:
        return None
    if hasattr(past, "crop"):
        # a negative count of positions to remove: transformers 5 takes only that; 4.x takes it too (and, there, a
        # positive value is the length to keep, which 5 refuses)
        extra = past.get_seq_length() - length
        if extra > 0:
            past.crop(-extra)
        return past
    if isinstance(past, torch.Tensor):
        return past[..., :length, :]
    if isinstance(past, (tuple, list)):
        return type(past)(crop_past(item, length) for item in past)
    raise PerflabError(f"cannot roll back a past_key_values of type {type(past).__name__} for speculative "
                       "decoding: use a transformers Cache (with crop) or (key, value) tuples per layer")


def open_session(model: nn.Module, batch: int, max_seq: int, device: torch.device, dtype: torch.dtype,
                 static: bool = False, compile_mode: Optional[str] = None, largest_compiled: int = 1,
                 tuning: str = DEFAULT_DECODE_TUNING, sdpa: str = "auto", graphs: str = "perflab"):
    """A session for `model`: the built-in Decoder's own caches, or the transformers convention."""
    if isinstance(model, Decoder):
        return DecoderSession(model, batch, max_seq, static, device, dtype, compile_mode, largest_compiled, tuning,
                              sdpa, graphs)
    return CausalLMSession(model, batch, max_seq, device)

"""Greedy decoding through a session: prefill, then one token per step, timed per token without a host sync.

Per decode token the host launches the step (one CUDA graph replay when compiled with reduce-overhead: the argmax
is inside it), copies the chosen token into the output, and records a CUDA event for the clock. Nothing reads a
value back: the host runs ahead of the device until the trial's final synchronize.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from perflab.step.timers import NullTimer
from perflab.profile.markers import no_mark

NULL_TIMER = NullTimer()


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely next token after the last position: (batch, 1)."""
    return logits[:, -1:].argmax(dim=-1)


def generate_greedy(session, prompt: torch.Tensor, new_tokens: int, clock: Optional[Any] = None,
                    timer: Any = NULL_TIMER, mark: type = no_mark) -> torch.Tensor:
    """`new_tokens` greedy tokens after `prompt` (batch, L): (batch, new_tokens). The first comes from the prefill."""
    out = torch.empty(prompt.shape[0], new_tokens, dtype=torch.long, device=prompt.device)
    if clock is not None:
        clock.begin(prompt.shape[0], prompt.shape[1])
    with timer.phase("prefill"), mark("prefill"):
        token = greedy(session.start(prompt))
        out[:, :1] = token
        if clock is not None:
            clock.emit(1)
    with timer.phase("decode"), mark("decode"):
        for index in range(1, new_tokens):
            if clock is not None:
                clock.step_begins()
            # the next input is the step's own output (as in gpt-fast): valid until the next call, copied into out
            token = session.extend_greedy(token)[:, -1:]
            out[:, index:index + 1] = token
            if clock is not None:
                clock.emit(1)
    return out


def teacher_forced_logits(session, prompt: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """The logits a session gives for each next token while fed `continuation` one token at a time (its decode
    path: cache, compiled step): (batch, tokens, vocab), position i predicting continuation[:, i]."""
    steps = [session.start(prompt)[:, -1:].float().clone()]
    for index in range(continuation.shape[1] - 1):
        steps.append(session.extend(continuation[:, index:index + 1])[:, -1:].float().clone())
    return torch.cat(steps, dim=1)

"""The compiled decode step captured as CUDA graphs by perflab: one graph per extension length, replayed per step.

With Inductor's own CUDA graphs (reduce-overhead: cudagraph trees) every call still runs Dynamo's guards and the
trees' bookkeeping on the host. On the H100 the host took 1.08 ms to issue a 1b bf16 step that the GPU ran in
1.26 ms, and 4.1 ms with int8 weights (tensor subclasses, which Dynamo checks on every call). Captured here, around
the step compiled without Inductor's graphs, the guards run once, at capture; a step then costs the host two
small writes into the graph's static inputs and one replay.

A graph is captured at the first step of its length, at the request's own positions with its own tokens: the
warm-up calls write the same keys and values that the step then writes, so capturing never disturbs the request.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from perflab.step.graph_capture import capture_graph


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # static inputs: written before each replay
    positions: torch.Tensor
    logits: torch.Tensor  # static outputs: rewritten by each replay
    chosen: torch.Tensor


class CapturedDecode:
    """`step(tokens, positions) -> (logits, chosen)` replayed from CUDA graphs, one per token count."""

    def __init__(self, step: Callable, attention: Callable[[], ContextManager]):
        self.step = step
        self.attention = attention  # the SDPA context the step is traced and captured in
        self.pool = torch.cuda.graph_pool_handle()  # the graphs share one memory pool (one runs at a time)
        self.graphs: dict[int, _Captured] = {}
        self.lengths: list[int] = []  # token counts captured, in order (kept after close, for result.json)

    def __call__(self, tokens: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `tokens` (batch, T) at positions start..start+T-1; the graph's own (logits, chosen), valid until the
        next call with the same T."""
        count = tokens.shape[1]
        captured = self.graphs.get(count)
        if captured is None:
            captured = self.graphs[count] = self._capture(tokens, start)
            self.lengths.append(count)
        else:
            captured.tokens.copy_(tokens)
            torch.arange(start, start + count, out=captured.positions)
        captured.graph.replay()
        return captured.logits, captured.chosen

    def _capture(self, tokens: torch.Tensor, start: int) -> _Captured:
        static_tokens = tokens.clone(memory_format=torch.contiguous_format)
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        with self.attention():  # the first warm-up call compiles and tunes the step
            graph, (logits, chosen) = capture_graph(lambda: self.step(static_tokens, positions), pool=self.pool)
        return _Captured(graph, static_tokens, positions, logits, chosen)

    def close(self) -> None:
        """Release the graphs and their memory pool's blocks."""
        self.graphs.clear()

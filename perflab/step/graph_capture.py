"""Capturing a CUDA graph the way the CUDA graphs docs ask: warm-up calls on a side stream, then the capture."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

WARMUP_ITERATIONS = 3  # eager calls on a side stream before capture (the first may compile, tune, allocate)


def capture_graph(run: Callable[[], Any], pool: Optional[Any] = None,
                  warmup: int = WARMUP_ITERATIONS) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`run()` warmed up on a side stream, then captured (in `pool` when given); the graph and what the captured
    call returned (its static outputs, rewritten by every replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph, outputs

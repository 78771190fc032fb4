"""The compiled decode step: torch.compile with gpt-fast's Inductor settings, scoped to that one function.

At batch 1 a decode step multiplies a (1, dim) activation by every weight matrix. Inductor only generates
matrix-vector products that reach the memory bandwidth with coordinate descent tuning on: it then decomposes a
(1, K) x (K, N) product into a fused multiply-and-reduce kernel (int8 weights dequantised inside it) and tunes its
block sizes, instead of calling cuBLAS (torch/_inductor/decomposition.py: "Our matrix vector multiplies only
achieve peak bandwidth with coordinate descent tuning"). gpt-fast sets these globally; here they go through
`torch.compile(options=...)`, which patches Inductor's config only while the decode step compiles, so nothing
else in the process changes. gpt-fast also traces decode under the math SDPA backend so that Inductor generates
the attention itself (one query token: two small matrix-vector products), done here when --sdpa is auto.

Named settings (DECODE_TUNINGS in perflab/workloads/generation.py, `--option decode_tuning=NAME`): gpt-fast's; `autotune`, gpt-fast's plus
Inductor's wider reduction search; `off`, the mode's settings alone (cuBLAS multiplies the matrices). A still wider
coordinate descent (search radius 2, every direction checked) did not finish compiling the 1b step within 6 minutes
on the H100, so it is not offered.
Why `off` is the default for plain weights: for a reduction along contiguous memory (a matrix-vector product reads
each weight row end to end) Inductor starts coordinate descent from one heuristic config, and where the descent
stops varies from compile to compile. On the H100 (2026-11-23) the same 2048 -> 8192 GELU product of the 1b bf16
step ran in 25.7, 17.7 and 13.6 us in three compiles (11.6 us at the calibrated bandwidth), and whole steps in
1.26-1.62 ms over nine compiles with gpt-fast's settings and 1.39-1.51 ms over three with `autotune`, with the SM
clock at 1,980 MHz throughout every compile (so not an idle GPU's low clock). With `off` three compiles in two
sessions gave 1.374, 1.379 and 1.377 ms, compiling in 15-20 s instead of 45-60 s: the same median, without the
spread, so a comparison of two runs measures the change and not the compile. Quantized weights through torchao's
default kernel keep gpt-fast's settings (QUANTIZED_DECODE_TUNING): only Inductor's generated product dequantises int8
inside it; through gemlite's kernels (opaque to Inductor) they take `off` as plain weights do.

Where the mode captures CUDA graphs (reduce-overhead, max-autotune), perflab captures the compiled step itself
(decode_graph.py) and Inductor compiles it without its own graphs; `--option decode_graphs=inductor` leaves the
graphs to Inductor's cudagraph trees instead (for comparison).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import torch

from perflab.workloads.generation import DECODE_TUNINGS
from perflab.backends import sdpa_context

def wants_graphs(mode: Optional[str]) -> bool:
    """Whether a torch.compile mode captures CUDA graphs (reduce-overhead, max-autotune)."""
    import torch._inductor
    return bool(torch._inductor.list_mode_options(mode or "default").get("triton.cudagraphs"))


def inductor_options(mode: Optional[str], tuning: str, inductor_graphs: bool = True) -> dict[str, Any]:
    """Inductor's options for `mode` (reduce-overhead: CUDA graphs, unless `inductor_graphs` is False: perflab
    captures them), plus the named decode tuning's settings (those this torch knows)."""
    import torch._inductor
    import torch._inductor.config
    options = dict(torch._inductor.list_mode_options(mode or "default"))
    if not inductor_graphs:
        options.pop("triton.cudagraphs", None)
    known = torch._inductor.config.get_config_copy()
    options.update({key: value for key, value in DECODE_TUNINGS[tuning].items() if key in known})
    return options


def compile_decode(step: Callable, mode: Optional[str], tuning: str, inductor_graphs: bool = True
                   ) -> tuple[Callable, dict[str, Any]]:
    """`step` compiled whole (fullgraph: a graph break is an error, not a silent slowdown) for fixed shapes;
    returns it with the Inductor options it compiles with."""
    options = inductor_options(mode, tuning, inductor_graphs)
    if options.get("triton.cudagraphs"):
        # imported now, not first inside torch._dynamo.reset() (session.close): importing it registers a backend,
        # and reset would fail with "dictionary changed size during iteration" over its backends
        from torch._inductor import cudagraph_trees  # noqa: F401  (not `import torch...`: torch would turn local)
    # torch.compile takes a mode or options, not both: the mode's own options are already in `options`
    compiled = torch.compile(step, options=options or None, fullgraph=True, dynamic=False)
    return compiled, options


def decode_attention(tuning: str, sdpa: str) -> tuple[Callable[[], ContextManager], str]:
    """The SDPA context the compiled decode runs (and is traced) in, and its name for result.json: the math backend
    when tuned (a tuning with Inductor settings of its own) and no --sdpa backend was pinned (Inductor then
    generates the attention), otherwise the run's."""
    if DECODE_TUNINGS[tuning] and sdpa == "auto":
        return sdpa_context("math"), "math (Inductor generates the attention)"
    return contextlib.nullcontext, sdpa if sdpa != "auto" else "auto (PyTorch picks per call)"


def cudagraph_skips() -> int:
    """How many compiled graphs Inductor has run without CUDA graphs so far in this process (its counter); a rise
    while the decode step compiles means reduce-overhead did not capture it (TORCH_LOGS=cudagraphs says why)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])

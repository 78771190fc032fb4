"""What the anti-pattern rules share: the forward calls of the op graph in order per thread, the backward calls
autograd made from them (by Sequence number), shapes and dtypes by op, and where a match sits (module, line)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from perflab.diagnose.findings import Context
from perflab.diagnose.op_graph import VIEWS, OpCall  # noqa: F401  (the pattern rules read VIEWS from here)
from perflab.diagnose.phases import phase_intervals

MIN_SHARE_PCT = 2.0  # a pattern explaining less of the step is not worth a finding
TINY_CALL_US_GPU = 10.0  # elementwise ops shorter than this (with their backward) are launch-bound, not bandwidth
TINY_CALL_US_CPU = 30.0
TINY_CALL_BYTES = 2**20  # ... or moving less than this: their time is the launch, not the memory traffic
# Hand-written attention is recognised structurally (an s x s matrix between two matmuls): more specific than the
# class-level rule that sees the same time, so from a third of the step it may pass the class rules' cap by a hair.
ATTENTION_MAX_CONFIDENCE = 0.96
# Other patterns measure their share against the wall-clock step, idle time included: they stay below the cap of
# the direct signals (data wait, syncs, copies: 0.95), which name what the idle time is.
PATTERN_MAX_CONFIDENCE = 0.9
# Launch-bound optimizer loops refine the launch-overhead class; fp32 matmuls and odd dims refine compute bound,
# which compute.py already names (with tf32/bf16) from the same kernels: named, rarely the verdict.
OPTIMIZER_MAX_CONFIDENCE = 0.85
REFINEMENT_MAX_CONFIDENCE = 0.6
MINOR_MAX_CONFIDENCE = 0.45  # habits that cost a little (bias before BN, zeroed grads): named, never the verdict
MATMULS = {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum", "aten::mm"}
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax"}
POINTWISE = {"aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
             "aten::sin", "aten::cos", "aten::exp", "aten::log", "aten::relu", "aten::relu_", "aten::gelu",
             "aten::silu", "aten::sigmoid", "aten::tanh", "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::neg",
             "aten::abs", "aten::clamp", "aten::where", "aten::masked_fill", "aten::dropout", "aten::square",
             "aten::layer_norm", "aten::group_norm", "aten::batch_norm", "aten::rms_norm", "aten::erf",
             "aten::reciprocal", "aten::addcmul", "aten::leaky_relu", "aten::hardtanh", "aten::mean", "aten::sum"}
SIXTEEN_BIT_DTYPES = {"c10::BFloat16", "c10::Half"}  # as the profiler records input dtypes
COPY_OPS = {"aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::copy_"}


@dataclass
class Match:
    """One occurrence of a pattern: the forward calls it is made of."""

    calls: list[OpCall]
    detail: str = ""


class PatternContext:
    """What the pattern rules share: forward calls in order per thread, backward calls by sequence number."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.trace = ctx.trace
        self.graph = ctx.graph
        calls = self.graph.calls
        optimizer = phase_intervals(self.trace, ("optimizer",))
        in_optimizer = optimizer.contains(np.array([c.start_us for c in calls])) if calls else np.zeros(0, bool)
        self.optimizer_calls = [c for c, inside in zip(calls, in_optimizer) if inside]
        self.forward = [c for c, inside in zip(calls, in_optimizer) if not inside and not c.backward]
        self.backward_by_seq: dict[int, list[OpCall]] = {}
        for call in calls:
            if call.backward and call.seq >= 0:
                self.backward_by_seq.setdefault(call.seq, []).append(call)
        self.window_us = max(ctx.profile.step_ms * ctx.profile.steps * 1e3, 1e-9)

    def dims(self, index: int) -> list:
        inputs = self.trace.inputs.get(int(self.trace.cpu_ops.ext_id[index]))
        return inputs[0] if inputs else []

    def dtypes(self, index: int) -> list:
        inputs = self.trace.inputs.get(int(self.trace.cpu_ops.ext_id[index]))
        return inputs[1] if inputs else []

    def subtree(self, call: OpCall) -> np.ndarray:
        return np.concatenate(([call.index], self.graph.descendants(call.index))).astype(np.int64)

    def names(self, call: OpCall) -> set[str]:
        ops = self.trace.cpu_ops
        return {ops.name(int(i)) for i in self.subtree(call)}

    def with_backward_us(self, calls: list[OpCall]) -> float:
        """Device time of these forward calls plus every backward call autograd made from them."""
        return sum(c.device_us for c in calls) + self.backward_us(calls)

    def backward_us(self, calls: list[OpCall]) -> float:
        """Device time of every backward call autograd made from these forward calls."""
        seqs = {int(s) for call in calls for s in self.graph.seq[self.subtree(call)] if s >= 0}
        backward = {id(b): b for seq in seqs for b in self.backward_by_seq.get(seq, [])}
        return sum(b.device_us for b in backward.values())

    def share_pct(self, us: float) -> float:
        return min(100.0, 100 * us / self.window_us)

    def per_thread(self) -> dict[int, list[OpCall]]:
        threads: dict[int, list[OpCall]] = {}
        for call in self.forward:
            threads.setdefault(call.tid, []).append(call)
        return threads


@dataclass
class Where:
    """Where a pattern's matches sit: the costliest one's module, up to 8 modules, its line and op, and how often
    it occurs. Its fields lead the finding's evidence (evidence())."""

    module: str
    modules: list[str]
    line: Optional[str]
    op: str
    occurrences_per_step: float

    def evidence(self) -> dict[str, Any]:
        return asdict(self)


def where_of(matches: list[Match], steps: int = 1) -> Where:
    """Module(s) and line of the matches, most costly first."""
    modules = list(dict.fromkeys(m.calls[0].module or "(no module)" for m in matches))
    lines = list(dict.fromkeys(m.calls[0].line for m in matches if m.calls[0].line))
    return Where(module=modules[0], modules=modules[:8], line=lines[0] if lines else None,
                 op=matches[0].calls[0].name, occurrences_per_step=len(matches) / max(steps, 1))


def place(where: Where) -> str:
    more = f" (and {len(where.modules) - 1} more)" if len(where.modules) > 1 else ""
    line = f", {where.line}" if where.line else ""
    return f"{where.module}{more}{line}"


def pattern_context(ctx: Context) -> Optional[PatternContext]:
    if ctx.trace is None or ctx.graph is None or ctx.profile is None:
        return None
    cached = getattr(ctx, "_pattern_context", None)
    if cached is None:
        cached = PatternContext(ctx)
        object.__setattr__(ctx, "_pattern_context", cached)
    return cached

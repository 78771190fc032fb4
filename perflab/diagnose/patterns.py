"""Anti-patterns over the op graph: code shapes with a known fix, each named by its op, module and line, with the
share of the step it explains and the lever or code change that removes it.

Every rule reads the parsed structure (perflab.diagnose.op_graph), so it works on CPU traces as on GPU ones. The
pattern's time is its forward ops plus the backward ops autograd made from them (Sequence numbers). torch's own
matcher (torch.profiler._pattern_matcher, private, absent from some versions) runs at capture time when it can;
what it found is added as evidence (see torch_matcher.py), never relied on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from perflab.diagnose.findings import (COMPUTE_BOUND, LAUNCH_OVERHEAD, MEMORY_BANDWIDTH, Context, Finding, clamp,
                                       gain, rounded)
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.phases import phase_intervals

MIN_SHARE_PCT = 2.0
TINY_CALL_US_GPU = 10.0  # elementwise ops shorter than this (with their backward) are launch-bound, not bandwidth
TINY_CALL_US_CPU = 30.0  # a pattern explaining less of the step is not worth a finding
# Hand-written attention is recognised structurally (an s x s matrix between two matmuls): more specific than the
# class-level rule that sees the same time, so it may pass the class rules' cap by a hair and rank first.
ATTENTION_MAX_CONFIDENCE = 0.96
PATTERN_MAX_CONFIDENCE = 0.95
# fp32 matmuls, odd dims and optimizer loops refine a class another rule already names from the same time (compute
# bound, launch overhead): they rank below it and never displace a direct signal (a sync, a data wait).
REFINEMENT_MAX_CONFIDENCE = 0.85
MINOR_MAX_CONFIDENCE = 0.45  # habits that cost a little (bias before BN, zeroed grads): named, never the verdict
MATMULS = {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum", "aten::mm"}
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::log_softmax"}
POINTWISE = {"aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
             "aten::sin", "aten::cos", "aten::exp", "aten::log", "aten::relu", "aten::relu_", "aten::gelu",
             "aten::silu", "aten::sigmoid", "aten::tanh", "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::neg",
             "aten::abs", "aten::clamp", "aten::where", "aten::masked_fill", "aten::dropout", "aten::square",
             "aten::layer_norm", "aten::group_norm", "aten::batch_norm", "aten::rms_norm", "aten::erf",
             "aten::reciprocal", "aten::addcmul", "aten::leaky_relu", "aten::hardtanh", "aten::mean", "aten::sum"}
VIEWS = {"aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::t", "aten::expand",
         "aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::unflatten", "aten::select", "aten::slice",
         "aten::split", "aten::chunk", "aten::unbind", "aten::detach", "aten::alias", "aten::as_strided"}
LINEAR_OPS = {"aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::einsum"}
SHAPED_LEAVES = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
OPTIMIZER_ELEMENTWISE = {"aten::add_", "aten::mul_", "aten::addcdiv_", "aten::addcmul_", "aten::lerp_",
                         "aten::sqrt", "aten::div", "aten::add", "aten::mul", "aten::neg", "aten::copy_"}
COPY_OPS = {"aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::copy_"}


@dataclass
class Match:
    """One occurrence of a pattern: the forward calls it is made of."""

    calls: list[OpCall]
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


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
        seqs = {int(s) for call in calls for s in self.graph.seq[self.subtree(call)] if s >= 0}
        backward = {id(b): b for seq in seqs for b in self.backward_by_seq.get(seq, [])}
        return sum(c.device_us for c in calls) + sum(b.device_us for b in backward.values())

    def share_pct(self, us: float) -> float:
        return min(100.0, 100 * us / self.window_us)

    def per_thread(self) -> dict[int, list[OpCall]]:
        threads: dict[int, list[OpCall]] = {}
        for call in self.forward:
            threads.setdefault(call.tid, []).append(call)
        return threads


def _where(matches: list[Match], steps: int = 1) -> dict[str, Any]:
    """Module(s) and line of the matches, most costly first."""
    modules = list(dict.fromkeys(m.calls[0].module or "(no module)" for m in matches))
    lines = list(dict.fromkeys(m.calls[0].line for m in matches if m.calls[0].line))
    return {"module": modules[0], "modules": modules[:8], "line": lines[0] if lines else None,
            "op": matches[0].calls[0].name, "occurrences_per_step": len(matches) / max(steps, 1)}


def _place(where: dict[str, Any]) -> str:
    more = f" (and {len(where['modules']) - 1} more)" if len(where["modules"]) > 1 else ""
    line = f", {where['line']}" if where["line"] else ""
    return f"{where['module']}{more}{line}"


# --- hand-written attention -----------------------------------------------------------------------------------

def _last2(dims: list, position: int) -> Optional[tuple[int, int]]:
    shape = dims[position] if len(dims) > position else None
    if isinstance(shape, list) and len(shape) >= 2 and all(isinstance(d, int) for d in shape[-2:]):
        return shape[-2], shape[-1]
    return None


def find_hand_attention(pc: PatternContext, window: int = 8) -> list[Match]:
    """matmul giving an s x s tensor, a softmax over it, a matmul that reads it: the pattern SDPA replaces."""
    matches = []
    for calls in pc.per_thread().values():
        i = 0
        while i < len(calls):
            first = calls[i]
            a, b = _last2(pc.dims(first.index), 0), _last2(pc.dims(first.index), 1)
            if first.name not in MATMULS or a is None or b is None or a[0] != b[1] or a[0] < 8:
                i += 1
                continue
            s = a[0]
            softmax = next((j for j in range(i + 1, min(len(calls), i + window))
                            if calls[j].name in SOFTMAX and _last2(pc.dims(calls[j].index), 0) == (s, s)), None)
            second = None
            if softmax is not None:
                second = next((j for j in range(softmax + 1, min(len(calls), softmax + window))
                               if calls[j].name in MATMULS and _last2(pc.dims(calls[j].index), 0) == (s, s)), None)
            if second is None:
                i += 1
                continue
            part = calls[i:second + 1]
            matches.append(Match(part, f"{first.name} -> {calls[softmax].name} -> {calls[second].name} over "
                                       f"{s}x{s} scores", {"seq_len": s, "matmuls": [first, calls[second]]}))
            i = second + 1
    return matches


def hand_attention(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    matches = find_hand_attention(pc)
    if not matches:
        return None
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    matmul_us = sum(pc.with_backward_us(m.extra["matmuls"]) for m in matches)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    where = _where(matches, ctx.profile.steps)
    # SDPA's kernels do the same two matmuls without writing the s x s scores: what the pattern spends outside its
    # matmuls (softmax, scale, masks, the scores' memory traffic) goes, and the matmuls themselves run fused.
    saved_us = (total_us - matmul_us) + 0.3 * matmul_us
    other_share = 100 * (total_us - matmul_us) / total_us if total_us else 0.0
    evidence = {**where, "pattern": matches[0].detail, "pattern_share_of_step_pct": share,
                "pattern_ms_per_step": total_us / 1e3 / ctx.profile.steps,
                "outside_matmuls_pct_of_pattern": other_share}
    levers = ctx.rank_levers(["sdpa-flash", "sdpa-efficient"]) if ctx.config("workload") == "transformer" else []
    s = matches[0].extra["seq_len"]
    return Finding(
        cls=MEMORY_BANDWIDTH if other_share >= 50 else COMPUTE_BOUND,
        confidence=clamp(0.4 + share / 50, high=ATTENTION_MAX_CONFIDENCE),
        summary=f"hand-written attention in {_place(where)}: matmul -> softmax -> matmul over a {s}x{s} score "
                f"matrix takes {share:.0f}% of the step ({where['occurrences_per_step']:g}x per step)",
        evidence=rounded(evidence), levers=levers,
        advice=[f"in {where['module']}, replace the matmul/softmax/matmul with "
                "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...): "
                "flash/memory-efficient kernels never write the s x s scores"],
        expected_gain_pct=gain(pc.share_pct(saved_us)),
        gain_basis="the pattern's measured time outside its two matmuls, plus 30% of the matmuls' (fused by SDPA)")


# --- long unfused elementwise chains --------------------------------------------------------------------------

def find_elementwise_chains(pc: PatternContext, min_length: int = 4) -> list[Match]:
    matches = []
    for calls in pc.per_thread().values():
        run: list[OpCall] = []
        for call in calls + [None]:
            if call is not None and call.name in VIEWS:
                continue
            if call is not None and call.name in POINTWISE:
                run.append(call)
                continue
            if len(run) >= min_length:
                matches.append(Match(run, f"{len(run)} elementwise ops in a row"))
            run = []
    return matches


def elementwise_chains(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    matches = sorted(find_elementwise_chains(pc), key=lambda m: -pc.with_backward_us(m.calls))
    if not matches:
        return None
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    share = pc.share_pct(total_us)
    if share < 5.0:
        return None
    longest = max(len(m.calls) for m in matches)
    where = _where(matches, ctx.profile.steps)
    # chains of tiny ops cost their launches, not their memory traffic (compile fixes both)
    mean_call_us = total_us / max(1, sum(len(m.calls) for m in matches))
    tiny = mean_call_us < (TINY_CALL_US_GPU if ctx.on_gpu else TINY_CALL_US_CPU)
    # fused, a chain of n ops reads its inputs and writes its output once instead of n times
    saved_fraction = 1 - 2 / max(longest, 2)
    evidence = {**where, "chains_per_step": len(matches) / ctx.profile.steps, "longest_chain_ops": longest,
                "chain_share_of_step_pct": share, "ops": sorted({c.name for c in matches[0].calls})}
    return Finding(
        cls=LAUNCH_OVERHEAD if tiny else MEMORY_BANDWIDTH,
        confidence=clamp(0.3 + share / 60, high=PATTERN_MAX_CONFIDENCE),
        summary=f"unfused elementwise chains ({longest} ops in a row, in {_place(where)}) take {share:.0f}% of the "
                "step: " + (f"{mean_call_us:.0f} µs per op, launched one by one" if tiny else
                            "each op reads and writes the whole tensor"),
        evidence=rounded(evidence), levers=ctx.rank_levers(["compile"]),
        advice=["torch.compile fuses the chain into one kernel (or write it as one fused op)"],
        expected_gain_pct=gain(share * saved_fraction),
        gain_basis=f"the chains' measured time x (1 - 2/{longest}): one read and one write instead of {longest}")


# --- FP32 matmuls with TF32 off; 16-bit dims not a multiple of 8 ----------------------------------------------

def _linear_calls(pc: PatternContext) -> list[tuple[OpCall, list[int]]]:
    """Forward matmul/conv calls with the shaped leaf ops (mm, addmm, bmm, conv) inside them."""
    ops = pc.trace.cpu_ops
    found = []
    for call in pc.forward:
        if call.name not in LINEAR_OPS:
            continue
        leaves = [int(i) for i in pc.subtree(call)
                  if ops.name(int(i)) in SHAPED_LEAVES or "convolution" in ops.name(int(i))]
        found.append((call, leaves))
    return found


def fp32_matmuls(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    precision = ctx.config("precision")
    if precision not in (None, "fp32"):
        return None
    if ctx.on_gpu and precision is None and any("tf32" in n for n in ctx.trace.kernels.names):
        return None
    fp32 = [call for call, leaves in _linear_calls(pc)
            if leaves and all(pc.dtypes(i)[:1] == ["float"] for i in leaves)]
    if not fp32:
        return None
    matches = [Match([c]) for c in sorted(fp32, key=lambda c: -c.device_us)]
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    share = pc.share_pct(total_us)
    if share < 10.0:
        return None
    where = _where(matches, ctx.profile.steps)
    speedup = _tf32_speedup(ctx) if ctx.on_gpu else 1.5
    evidence = {**where, "fp32_matmul_share_of_step_pct": share, "expected_speedup_of_matmuls": speedup}
    # TF32 is a CUDA feature: on a CPU trace the finding is a note for the GPU run, not this run's verdict
    high = REFINEMENT_MAX_CONFIDENCE if ctx.on_gpu else MINOR_MAX_CONFIDENCE
    levers = ctx.rank_levers(["tf32", "bf16"]) if ctx.on_gpu else ctx.rank_levers(["bf16"])
    return Finding(
        cls=COMPUTE_BOUND, confidence=clamp(0.3 + share / 60, high=high),
        summary=f"fp32 matmuls/convs with TF32 off (most in {_place(where)}) take {share:.0f}% of the step"
                + ("" if ctx.on_gpu else " (on CUDA, TF32 tensor cores; here, bf16)"),
        evidence=rounded(evidence), levers=levers,
        advice=["torch.backends.cuda.matmul.allow_tf32 = True (torch.set_float32_matmul_precision('high')), "
                "or bf16 autocast"],
        expected_gain_pct=gain(share * (1 - 1 / speedup)),
        gain_basis=f"the fp32 matmuls' measured time, {speedup:.1f}x faster at the calibrated TF32/bf16 peak")


def _tf32_speedup(ctx: Context) -> float:
    from perflab.diagnose.roofline import ceilings
    peaks = ceilings(ctx.trace).get("tflops") or {}
    fast, slow = peaks.get("tf32") or peaks.get("bf16"), peaks.get("fp32")
    # matmuls at their roof rarely reach the full ratio (memory-bound edges, epilogues): cap it
    return min(4.0, fast / slow) if fast and slow else 2.0


def odd_16bit_dims(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    odd = []
    for call, leaves in _linear_calls(pc):
        bad = [i for i in leaves if pc.dtypes(i)[:1] in (["c10::BFloat16"], ["c10::Half"]) and _odd_dims(pc, i)]
        if bad:
            odd.append((call, _odd_dims(pc, bad[0])))
    if not odd:
        return None
    matches = [Match([c], extra={"dims": d}) for c, d in sorted(odd, key=lambda p: -p[0].device_us)]
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    where = _where(matches, ctx.profile.steps)
    dims = matches[0].extra["dims"]
    return Finding(
        cls=COMPUTE_BOUND, confidence=clamp(0.3 + share / 60, high=REFINEMENT_MAX_CONFIDENCE),
        summary=f"16-bit matmuls with dims not a multiple of 8 ({', '.join(map(str, dims))} in {_place(where)}) "
                f"take {share:.0f}% of the step: tensor cores run them padded or not at all",
        evidence=rounded({**where, "odd_dims": dims, "share_of_step_pct": share}), levers=[],
        advice=[f"pad the model's widths to multiples of 8 (e.g. {dims[0]} -> {-(-dims[0] // 8) * 8}); "
                "vocabulary sizes to multiples of 64"],
        expected_gain_pct=gain(0.3 * share), gain_basis="30% of those matmuls' measured time (aligned tiles)")


def _odd_dims(pc: PatternContext, index: int) -> list[int]:
    dims = pc.dims(index)
    sizes = [d for shape in dims[:3] if isinstance(shape, list) for d in shape[-2:] if isinstance(d, int)]
    return sorted({d for d in sizes if d > 8 and d % 8})


# --- optimizer: single-tensor loops, zeroed gradients ---------------------------------------------------------

def single_tensor_optimizer(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None or not pc.optimizer_calls:
        return None
    names = [c.name for c in pc.optimizer_calls]
    if any(n.startswith(("aten::_foreach_", "aten::_fused_")) for n in names):
        return None
    loops = [c for c in pc.optimizer_calls if c.name in OPTIMIZER_ELEMENTWISE]
    per_step = len(loops) / ctx.profile.steps
    if per_step < 20:
        return None
    total_us = sum(c.device_us for c in loops)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    kernels_us = total_us
    evidence = {"op": loops[0].name, "module": "optimizer", "line": None, "elementwise_ops_per_step": per_step,
                "share_of_step_pct": share}
    return Finding(
        cls=LAUNCH_OVERHEAD, confidence=clamp(0.3 + share / 50, high=REFINEMENT_MAX_CONFIDENCE),
        summary=f"the optimizer updates one tensor at a time: {per_step:.0f} elementwise ops per step, "
                f"{share:.0f}% of the step",
        evidence=rounded(evidence), levers=ctx.rank_levers(["fused-optimizer", "foreach-optimizer"]),
        advice=["build the optimizer with fused=True (or foreach=True): one kernel over all parameters"],
        expected_gain_pct=gain(pc.share_pct(0.8 * kernels_us)),
        gain_basis="80% of the per-tensor update ops' measured time (one fused kernel remains)")


def zeroed_grads(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    zeroing = [c for c in pc.optimizer_calls if c.name in ("aten::zero_", "aten::fill_")]
    per_step = len(zeroing) / ctx.profile.steps
    if per_step < 4:
        return None
    share = pc.share_pct(sum(c.device_us for c in zeroing))
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.2 + share / 20, high=MINOR_MAX_CONFIDENCE),
        summary=f"gradients are zeroed, not set to None: {per_step:.0f} zero_ ops per step ({share:.1f}% of it), "
                "and backward then adds into them instead of writing them",
        evidence=rounded({"op": "aten::zero_", "module": "optimizer", "line": None, "zero_ops_per_step": per_step,
                          "share_of_step_pct": share}),
        levers=[], advice=["optimizer.zero_grad(set_to_none=True) (the default since torch 2.0)"],
        expected_gain_pct=gain(share), gain_basis="the zero_ ops' measured time")


# --- conv bias before batch norm; extra copies ----------------------------------------------------------------

def conv_bias_batchnorm(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    matches = []
    for calls in pc.per_thread().values():
        # views and scalar bookkeeping (batch norm's num_batches_tracked += 1) sit between the two
        useful = [c for c in calls if c.name not in VIEWS and any(d for d in pc.dims(c.index) if d)]
        for conv, nxt in zip(useful, useful[1:]):
            dims = pc.dims(conv.index)
            if (conv.name.startswith(("aten::conv", "aten::_conv")) and len(dims) > 2 and dims[2]
                    and nxt.name in ("aten::batch_norm", "aten::_batch_norm_impl_index")):
                matches.append(Match([conv, nxt]))
    if not matches:
        return None
    conv_us = sum(pc.with_backward_us(m.calls[:1]) for m in matches)
    share = pc.share_pct(conv_us)
    where = _where(matches, ctx.profile.steps)
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.25 + share / 100, high=MINOR_MAX_CONFIDENCE),
        summary=f"{len(matches) // ctx.profile.steps} convs with a bias feed batch norm ({_place(where)}): the "
                "norm subtracts the mean, so the bias is computed, stored and differentiated for nothing",
        evidence=rounded({**where, "conv_share_of_step_pct": share}), levers=[],
        advice=["nn.Conv2d(..., bias=False) before BatchNorm"],
        expected_gain_pct=gain(0.05 * share), gain_basis="5% of those convs' time (the bias add and its gradient)")


def extra_copies(ctx: Context) -> Optional[Finding]:
    pc = _pattern_context(ctx)
    if pc is None:
        return None
    copies = [c for c in pc.forward if c.name in COPY_OPS]
    h2d_in_model = 0
    if ctx.on_gpu:
        h2d_in_model = _h2d_in_model(ctx)
    if not copies:
        return None
    total_us = sum(pc.with_backward_us([c]) for c in copies)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    matches = [Match([c]) for c in sorted(copies, key=lambda c: -c.device_us)]
    where = _where(matches, ctx.profile.steps)
    evidence = {**where, "copies_per_step": len(copies) / ctx.profile.steps, "share_of_step_pct": share,
                "h2d_copies_in_forward_backward_per_step": h2d_in_model / ctx.profile.steps}
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.25 + share / 40, high=0.7),
        summary=f"tensor copies inside the model ({len(copies) / ctx.profile.steps:.0f} per step, most in "
                f"{_place(where)}) take {share:.0f}% of the step",
        evidence=rounded(evidence), levers=[],
        advice=["create tensors on their device (torch.zeros(..., device=x.device)) instead of .to() each step",
                "drop .contiguous()/.clone()/dtype round trips the next op does not need"],
        expected_gain_pct=gain(share), gain_basis="the copies' measured time")


def _h2d_in_model(ctx: Context) -> int:
    mc = ctx.trace.memcpys
    model = phase_intervals(ctx.trace, ("forward", "backward"))
    h2d = mc.mask(lambda n: "HtoD" in n)
    return int((h2d & model.contains(mc.start_us)).sum())


def _pattern_context(ctx: Context) -> Optional[PatternContext]:
    if ctx.trace is None or ctx.graph is None or ctx.profile is None:
        return None
    cached = getattr(ctx, "_pattern_context", None)
    if cached is None:
        cached = PatternContext(ctx)
        object.__setattr__(ctx, "_pattern_context", cached)
    return cached


def _torch_matcher(ctx: Context) -> Optional[Finding]:
    from perflab.diagnose.torch_matcher import torch_matcher_finding
    return torch_matcher_finding(ctx)


PATTERN_RULES: list[Callable[[Context], Optional[Finding]]] = [
    hand_attention, elementwise_chains, fp32_matmuls, odd_16bit_dims, single_tensor_optimizer, zeroed_grads,
    conv_bias_batchnorm, extra_copies, _torch_matcher,
]

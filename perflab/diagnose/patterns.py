"""Anti-patterns over the op graph: code shapes with a known fix, each named by its op, module and line, with the
share of the step it explains and the lever or code change that removes it.

Every rule reads the parsed structure (perflab.diagnose.op_graph), so it works on CPU traces as on GPU ones. The
pattern's time is its forward ops plus the backward ops autograd made from them (Sequence numbers). torch's own
matcher (torch.profiler._pattern_matcher, private, absent from some versions) runs at capture time when it can;
what it found is added as evidence (see torch_matcher.py), never relied on.
"""
from __future__ import annotations

from typing import Callable, Optional

from perflab.bottlenecks import (COMPUTE_BOUND, HAND_WRITTEN_ATTENTION, LAUNCH_OVERHEAD, MEMORY_BANDWIDTH,
                                 UNFUSED_CHAINS)
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.pattern_context import (ATTENTION_MAX_CONFIDENCE, COPY_OPS, MATMULS, MIN_SHARE_PCT,
                                              MINOR_MAX_CONFIDENCE, PATTERN_MAX_CONFIDENCE, POINTWISE,
                                              SIXTEEN_BIT_DTYPES, SOFTMAX, TINY_CALL_BYTES, TINY_CALL_US_CPU,
                                              TINY_CALL_US_GPU, VIEWS, Match, PatternContext,
                                              pattern_context, place, where_of)
from perflab.diagnose.pattern_optimizer import single_tensor_optimizer, zeroed_grads
from perflab.diagnose.pattern_precision import fp32_matmuls, odd_16bit_dims
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.operators import call_bytes
from perflab.diagnose.phases import phase_intervals
from perflab.diagnose.torch_matcher import torch_matcher_finding
from perflab.levers import levers_for

FLASH_MATMUL_SAVING = 0.3  # of a 16-bit hand-written attention's matmul time, once flash SDPA fuses them


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
    pc = pattern_context(ctx)
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
    where = where_of(matches, ctx.profile.steps)
    # SDPA's kernels do the same two matmuls without writing the s x s scores: what the pattern spends outside its
    # matmuls (softmax, scale, masks, the scores' memory traffic) goes. In 16-bit the flash kernel also runs the
    # matmuls fused; in fp32 only the memory-efficient kernel applies, with no faster matmuls (on the H100: 19%
    # measured where 43% was predicted with them). A training step's backward recomputes the scores: one more of
    # the pattern's six matmul passes (two forward, four backward).
    sixteen_bit = any(dtype in SIXTEEN_BIT_DTYPES for m in matches for dtype in pc.dtypes(m.extra["matmuls"][0].index))
    backward = pc.backward_us(matches[0].extra["matmuls"]) > 0
    saved_us = (total_us - matmul_us) + (FLASH_MATMUL_SAVING * matmul_us if sixteen_bit else 0.0)
    if backward:
        saved_us -= matmul_us / 6
    other_share = 100 * (total_us - matmul_us) / total_us if total_us else 0.0
    evidence = {**where, "pattern": matches[0].detail, "pattern_share_of_step_pct": share,
                "pattern_ms_per_step": total_us / 1e3 / ctx.profile.steps,
                "outside_matmuls_pct_of_pattern": other_share}
    cls = MEMORY_BANDWIDTH if other_share >= 50 else COMPUTE_BOUND
    # the SDPA levers switch perflab's own transformer's kernels; any other model needs the code change
    levers = (ctx.rank_levers(levers_for(cls, {HAND_WRITTEN_ATTENTION}, always=False))
              if ctx.config("workload") == "transformer" else [])
    s = matches[0].extra["seq_len"]
    return Finding(
        cls=cls, confidence=clamp(0.3 + share / 50, high=ATTENTION_MAX_CONFIDENCE),
        summary=f"hand-written attention in {place(where)}: matmul -> softmax -> matmul over a {s}x{s} score "
                f"matrix takes {share:.0f}% of the step ({where['occurrences_per_step']:g}x per step)",
        evidence=rounded(evidence), levers=levers,
        advice=[f"in {where['module']}, replace the matmul/softmax/matmul with "
                "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...): "
                "flash/memory-efficient kernels never write the s x s scores"],
        expected_gain_pct=gain(pc.share_pct(saved_us)),
        gain_basis="the pattern's measured time outside its two matmuls" + (
            f", plus {FLASH_MATMUL_SAVING:.0%} of the matmuls' (fused by flash SDPA)" if sixteen_bit else
            " (fp32: no faster matmuls)") + (", less the backward's recompute of the scores" if backward else ""))


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


def chain_fusion_gain_pct(ctx: Context) -> Optional[float]:
    """The share of the step fusing the elementwise chains should give back (None: no chain worth fusing)."""
    pc = pattern_context(ctx)
    matches = find_elementwise_chains(pc) if pc is not None else []
    if not matches:
        return None
    return _fusion_gain_pct(pc, matches)


def _fusion_gain_pct(pc: PatternContext, matches: list[Match]) -> float:
    # fused, a forward chain of n ops reads its input and writes its output once instead of n times; its backward
    # still reads what the forward saved (or recomputes it) and reduces each parameter's gradient, so the gain to
    # expect counts the forward's fusion only (on the H100 compile gave 28% where the chains' whole share was 73%)
    longest = max(len(m.calls) for m in matches)
    forward_us = sum(c.device_us for m in matches for c in m.calls)
    return pc.share_pct(forward_us) * (1 - 2 / max(longest, 2))


def elementwise_chains(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None:
        return None
    matches = sorted(find_elementwise_chains(pc), key=lambda m: -pc.with_backward_us(m.calls))
    if not matches:
        return None
    forward_us = sum(c.device_us for m in matches for c in m.calls)
    share = pc.share_pct(forward_us + sum(pc.backward_us(m.calls) for m in matches))
    if share < 5.0:
        return None
    longest = max(len(m.calls) for m in matches)
    where = where_of(matches, ctx.profile.steps)
    # chains of tiny ops cost their launches, not their memory traffic (compile fixes both)
    forward_calls = [c for m in matches for c in m.calls]
    mean_call_us = sum(c.device_us for c in forward_calls) / max(1, len(forward_calls))
    mean_bytes = sum(call_bytes(pc.trace, pc.graph, c) for c in forward_calls) / max(1, len(forward_calls))
    tiny = mean_bytes < TINY_CALL_BYTES or mean_call_us < (TINY_CALL_US_GPU if ctx.on_gpu else TINY_CALL_US_CPU)
    forward_share = pc.share_pct(forward_us)
    evidence = {**where, "chains_per_step": len(matches) / ctx.profile.steps, "longest_chain_ops": longest,
                "chain_share_of_step_pct": share, "forward_share_of_step_pct": forward_share,
                "ops": sorted({c.name for c in matches[0].calls})}
    cls = LAUNCH_OVERHEAD if tiny else MEMORY_BANDWIDTH
    return Finding(
        cls=cls,
        confidence=clamp(0.3 + share / 60, high=PATTERN_MAX_CONFIDENCE),
        summary=f"unfused elementwise chains ({longest} ops in a row, in {place(where)}) take {share:.0f}% of the "
                "step: " + (f"{mean_call_us:.0f} µs per op, launched one by one" if tiny else
                            "each op reads and writes the whole tensor"),
        evidence=rounded(evidence), levers=ctx.rank_levers(levers_for(cls, {UNFUSED_CHAINS}, always=False)),
        advice=["torch.compile fuses the chain into one kernel (or write it as one fused op)"],
        expected_gain_pct=gain(_fusion_gain_pct(pc, matches)),
        gain_basis=f"the forward chains' measured time x (1 - 2/{longest}): one read and one write instead of "
                   f"{longest}; the backward's fusion is not counted")


# --- conv bias before batch norm; extra copies ----------------------------------------------------------------

def conv_bias_batchnorm(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
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
    where = where_of(matches, ctx.profile.steps)
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.25 + share / 100, high=MINOR_MAX_CONFIDENCE),
        summary=f"{len(matches) // ctx.profile.steps} convs with a bias feed batch norm ({place(where)}): the "
                "norm subtracts the mean, so the bias is computed, stored and differentiated for nothing",
        evidence=rounded({**where, "conv_share_of_step_pct": share}), levers=[],
        advice=["nn.Conv2d(..., bias=False) before BatchNorm"],
        expected_gain_pct=gain(0.05 * share), gain_basis="5% of those convs' time (the bias add and its gradient)")


def extra_copies(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
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
    where = where_of(matches, ctx.profile.steps)
    evidence = {**where, "copies_per_step": len(copies) / ctx.profile.steps, "share_of_step_pct": share,
                "h2d_copies_in_forward_backward_per_step": h2d_in_model / ctx.profile.steps}
    return Finding(
        cls=MEMORY_BANDWIDTH, confidence=clamp(0.25 + share / 40, high=0.7),
        summary=f"tensor copies inside the model ({len(copies) / ctx.profile.steps:.0f} per step, most in "
                f"{place(where)}) take {share:.0f}% of the step",
        evidence=rounded(evidence), levers=[],
        advice=["create tensors on their device (torch.zeros(..., device=x.device)) instead of .to() each step",
                "drop .contiguous()/.clone()/dtype round trips the next op does not need"],
        expected_gain_pct=gain(share), gain_basis="the copies' measured time")


def _h2d_in_model(ctx: Context) -> int:
    mc = ctx.trace.memcpys
    model = phase_intervals(ctx.trace, ("forward", "backward"))
    h2d = mc.mask(lambda n: "HtoD" in n)
    return int((h2d & model.contains(mc.start_us)).sum())


def _torch_matcher(ctx: Context) -> Optional[Finding]:
    return torch_matcher_finding(ctx)


PATTERN_RULES: list[Callable[[Context], Optional[Finding]]] = [
    hand_attention, elementwise_chains, fp32_matmuls, odd_16bit_dims, single_tensor_optimizer, zeroed_grads,
    conv_bias_batchnorm, extra_copies, _torch_matcher,
]

"""Anti-patterns over the op graph: code shapes with a known fix, each named by its op, module and line, with the
share of the step it explains and the lever or code change that removes it.

Every rule reads the parsed structure (perflab.diagnose.op_graph), so it works on CPU traces as on GPU ones. The
pattern's time is its forward ops plus the backward ops autograd made from them (Sequence numbers). torch's own
matcher (torch.profiler._pattern_matcher, private, absent from some versions) runs at capture time when it can;
what it found is added as evidence (see torch_matcher.py), never relied on.
"""
from __future__ import annotations

from typing import Callable, Optional

from perflab.bottlenecks import LAUNCH_OVERHEAD, MEMORY_BANDWIDTH, UNFUSED_CHAINS
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.pattern_context import (COPY_OPS, MIN_SHARE_PCT, MINOR_MAX_CONFIDENCE, PATTERN_MAX_CONFIDENCE,
                                              POINTWISE, TINY_CALL_BYTES, TINY_CALL_US_CPU, TINY_CALL_US_GPU, VIEWS,
                                              Match, PatternContext, pattern_context, place, where_of)
from perflab.diagnose.pattern_attention import hand_attention
from perflab.diagnose.pattern_optimizer import single_tensor_optimizer, zeroed_grads
from perflab.diagnose.pattern_precision import fp32_matmuls, odd_16bit_dims
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.operators import call_bytes
from perflab.diagnose.phases import phase_intervals
from perflab.diagnose.torch_matcher import torch_matcher_finding
from perflab.levers import levers_for


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
    evidence = {**where.evidence(), "chains_per_step": len(matches) / ctx.profile.steps, "longest_chain_ops": longest,
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
        evidence=rounded({**where.evidence(), "conv_share_of_step_pct": share}), levers=[],
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
    evidence = {**where.evidence(), "copies_per_step": len(copies) / ctx.profile.steps, "share_of_step_pct": share,
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

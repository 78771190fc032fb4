"""Hand-written attention, as written in practice: matmul -> softmax -> matmul over an s x s score matrix, with what
usually comes with it: K/V repeated to the query heads (grouped-query / multi-query attention), a causal mask built
with triu/tril and applied with masked_fill(-inf), a softmax upcast to fp32. Each maps to an argument of
F.scaled_dot_product_attention, which the advice spells out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from perflab.bottlenecks import COMPUTE_BOUND, HAND_WRITTEN_ATTENTION, MEMORY_BANDWIDTH
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.pattern_context import (ATTENTION_MAX_CONFIDENCE, MATMULS, MIN_SHARE_PCT, SIXTEEN_BIT_DTYPES,
                                              SOFTMAX, Match, PatternContext, pattern_context, place, where_of)
from perflab.levers import levers_for

FLASH_MATMUL_SAVING = 0.3  # of a 16-bit hand-written attention's matmul time, once flash SDPA fuses them
KV_REPEATS = {"aten::repeat_interleave", "aten::expand", "aten::repeat"}  # K/V copied to the query heads
CAUSAL_BUILDERS = {"aten::triu", "aten::tril", "aten::triu_", "aten::tril_"}
MASK_APPLIERS = {"aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::add", "aten::add_"}
EXPAND_COPIES = {"aten::reshape", "aten::contiguous", "aten::clone", "aten::flatten"}
LOOK_BACK = 12  # calls before the first matmul where K/V repeats and the mask's construction are looked for


@dataclass
class AttentionShape:
    """What the hand-written attention does besides matmul -> softmax -> matmul."""

    kv_repeat: Optional[str] = None  # the op that repeats K/V to the query heads
    groups: Optional[int] = None  # query heads per K/V head, where the shapes say
    causal_builder: Optional[str] = None  # triu/tril
    mask_applier: Optional[str] = None  # masked_fill, where, add between the first matmul and the softmax
    fp32_softmax: bool = False  # the softmax runs in fp32 while the matmuls run in 16 bits

    def sdpa_call(self) -> str:
        args = ["q", "k", "v"]
        if self.causal_builder:
            args.append("is_causal=True")
        elif self.mask_applier:
            args.append("attn_mask=mask")
        if self.kv_repeat:
            args.append("enable_gqa=True")
        return f"F.scaled_dot_product_attention({', '.join(args)})"

    def described(self) -> list[str]:
        parts = []
        if self.kv_repeat:
            times = f" {self.groups}x" if self.groups else ""
            parts.append(f"grouped-query: K/V {self.kv_repeat.removeprefix('aten::')}{times} to the query heads")
        if self.causal_builder:
            parts.append(f"causal mask by {self.causal_builder.removeprefix('aten::')} + "
                         f"{(self.mask_applier or 'masked_fill').removeprefix('aten::')}")
        elif self.mask_applier:
            parts.append(f"mask applied by {self.mask_applier.removeprefix('aten::')}")
        if self.fp32_softmax:
            parts.append("fp32 softmax")
        return parts

    def notes(self) -> list[str]:
        notes = []
        if self.kv_repeat:
            notes.append("enable_gqa=True reads each K/V head for its group of query heads without the "
                         f"{self.kv_repeat.removeprefix('aten::')} copy (torch >= 2.5; before it, keep the repeat "
                         "of K/V and pass is_causal/attn_mask alone)")
        if self.causal_builder:
            notes.append("is_causal=True masks inside the kernel: drop the triu/tril mask and the masked_fill "
                         "(no s x s mask built or read, and flash skips the masked blocks)")
        elif self.mask_applier:
            notes.append("pass the mask as attn_mask= (a boolean mask, or an additive one in the query's dtype); "
                         "is_causal=True if it is causal")
        if self.fp32_softmax:
            notes.append("drop the fp32 upcast of the scores: SDPA's kernels accumulate the softmax in fp32 "
                         "internally")
        return notes


def _last2(dims: list, position: int) -> Optional[tuple[int, int]]:
    shape = dims[position] if len(dims) > position else None
    if isinstance(shape, list) and len(shape) >= 2 and all(isinstance(d, int) for d in shape[-2:]):
        return shape[-2], shape[-1]
    return None


@dataclass
class AttentionMatch(Match):
    """One hand-written attention: its two matmuls over an s x s score matrix, and what precedes them (shape)."""

    seq_len: int = 0
    matmuls: list[OpCall] = field(default_factory=list)
    shape: Optional[AttentionShape] = None
    end: int = 0  # the position after the second matmul in its thread's calls


def find_hand_attention(pc: PatternContext, window: int = 8) -> list[AttentionMatch]:
    """matmul giving an s x s tensor, a softmax over it, a matmul that reads it: the pattern SDPA replaces; with the
    K/V repeats and mask construction before it (AttentionMatch.shape)."""
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
            begin = _preamble_start(calls, i, matches[-1].end if matches else 0)
            shape = attention_shape(pc, calls[begin:second + 1], first, calls[softmax])
            matches.append(AttentionMatch(
                calls[begin:second + 1],
                f"{first.name} -> {calls[softmax].name} -> {calls[second].name} over {s}x{s} scores",
                seq_len=s, matmuls=[first, calls[second]], shape=shape, end=second + 1))
            i = second + 1
    return matches


def _preamble_start(calls: list[OpCall], first: int, floor: int) -> int:
    """The earliest K/V repeat or mask construction in the LOOK_BACK calls before the first matmul (not before the
    previous match's end): the pattern's own ops."""
    for j in range(max(floor, first - LOOK_BACK), first):
        if calls[j].name in CAUSAL_BUILDERS or _repeats_kv(calls, j):
            return j
    return first


def _repeats_kv(calls: list[OpCall], j: int) -> bool:
    """repeat_interleave/repeat, or an expand whose view the next calls copy (expand + reshape is a repeat)."""
    if calls[j].name in ("aten::repeat_interleave", "aten::repeat"):
        return True
    return calls[j].name == "aten::expand" and any(
        call.name in EXPAND_COPIES for call in calls[j + 1:j + 3])


def attention_shape(pc: PatternContext, calls: list[OpCall], first: OpCall, softmax: OpCall) -> AttentionShape:
    """GQA repeats, hand-built causal masks and an fp32 softmax among a match's calls."""
    names = [call.name for call in calls]
    shape = AttentionShape()
    repeat = next((call for j, call in enumerate(calls) if call.name in KV_REPEATS and _repeats_kv(calls, j)), None)
    if repeat is not None:
        shape.kv_repeat, shape.groups = repeat.name, _groups(pc, first, repeat)
    shape.causal_builder = next((name for name in names if name in CAUSAL_BUILDERS), None)
    between = calls[calls.index(first) + 1:calls.index(softmax)]
    shape.mask_applier = next((call.name for call in between if call.name in MASK_APPLIERS
                               and _is_score_sized(pc, call, softmax)), None)
    shape.fp32_softmax = _fp32_softmax(pc, first, softmax)
    return shape


def _groups(pc: PatternContext, first: OpCall, repeat: OpCall) -> Optional[int]:
    """Query heads per K/V head: the query's head count over the repeated tensor's (dims [b, heads, s, d])."""
    query, kv = pc.dims(first.index)[:1], pc.dims(repeat.index)[:1]
    if not query or not kv or not isinstance(query[0], list) or not isinstance(kv[0], list):
        return None
    if len(query[0]) != 4 or len(kv[0]) != 4 or not kv[0][1] or query[0][1] % kv[0][1]:
        return None
    groups = query[0][1] // kv[0][1]
    return groups if groups > 1 else None


def _is_score_sized(pc: PatternContext, call: OpCall, softmax: OpCall) -> bool:
    return _last2(pc.dims(call.index), 0) == _last2(pc.dims(softmax.index), 0)


def _fp32_softmax(pc: PatternContext, first: OpCall, softmax: OpCall) -> bool:
    """The matmuls run in 16 bits and the softmax (or the softmax autocast runs under it) reads fp32."""
    if pc.dtypes(first.index)[:1] not in ([dtype] for dtype in SIXTEEN_BIT_DTYPES):
        return False
    ops = pc.trace.cpu_ops
    softmaxes = [int(i) for i in pc.subtree(softmax) if ops.name(int(i)) in SOFTMAX]
    return any(pc.dtypes(i)[:1] == ["float"] for i in softmaxes)


def hand_attention(ctx: Context) -> Optional[Finding]:
    pc = pattern_context(ctx)
    if pc is None:
        return None
    matches = find_hand_attention(pc)
    if not matches:
        return None
    total_us = sum(pc.with_backward_us(m.calls) for m in matches)
    matmul_us = sum(pc.with_backward_us(m.matmuls) for m in matches)
    share = pc.share_pct(total_us)
    if share < MIN_SHARE_PCT:
        return None
    where = where_of(matches, ctx.profile.steps)
    # SDPA's kernels do the same two matmuls without writing the s x s scores: what the pattern spends outside its
    # matmuls (softmax, scale, masks, K/V repeats, the scores' memory traffic) goes. In 16-bit the flash kernel also
    # runs the matmuls fused; in fp32 only the memory-efficient kernel applies, with no faster matmuls (on the H100:
    # 19% measured where 43% was predicted with them). A training step's backward recomputes the scores: one more of
    # the pattern's six matmul passes (two forward, four backward).
    sixteen_bit = any(dtype in SIXTEEN_BIT_DTYPES for m in matches for dtype in pc.dtypes(m.matmuls[0].index))
    backward = pc.backward_us(matches[0].matmuls) > 0
    saved_us = (total_us - matmul_us) + (FLASH_MATMUL_SAVING * matmul_us if sixteen_bit else 0.0)
    if backward:
        saved_us -= matmul_us / 6
    other_share = 100 * (total_us - matmul_us) / total_us if total_us else 0.0
    shape = matches[0].shape
    evidence = {**where.evidence(), "pattern": matches[0].detail, "pattern_share_of_step_pct": share,
                "pattern_ms_per_step": total_us / 1e3 / ctx.profile.steps,
                "outside_matmuls_pct_of_pattern": other_share, "kv_repeat": shape.kv_repeat,
                "query_heads_per_kv_head": shape.groups, "causal_mask_builder": shape.causal_builder,
                "mask_applier": shape.mask_applier, "fp32_softmax": shape.fp32_softmax}
    cls = MEMORY_BANDWIDTH if other_share >= 50 else COMPUTE_BOUND
    # the SDPA levers switch perflab's own transformer's kernels; any other model needs the code change
    levers = (ctx.rank_levers(levers_for(cls, {HAND_WRITTEN_ATTENTION}, always=False))
              if ctx.config("workload") == "transformer" else [])
    s = matches[0].seq_len
    extras = shape.described()
    return Finding(
        cls=cls, confidence=clamp(0.3 + share / 50, high=ATTENTION_MAX_CONFIDENCE),
        summary=f"hand-written attention in {place(where)}: matmul -> softmax -> matmul over a {s}x{s} score "
                f"matrix" + (f" ({'; '.join(extras)})" if extras else "") + f" takes {share:.0f}% of the step "
                f"({where.occurrences_per_step:g}x per step)",
        evidence=rounded(evidence), levers=levers,
        advice=[f"in {where.module}, replace the matmul/softmax/matmul with torch.nn.functional."
                f"{shape.sdpa_call().removeprefix('F.')}: flash/memory-efficient kernels never write the s x s "
                "scores", *shape.notes()],
        expected_gain_pct=gain(pc.share_pct(saved_us)),
        gain_basis="the pattern's measured time outside its two matmuls" + (
            f", plus {FLASH_MATMUL_SAVING:.0%} of the matmuls' (fused by flash SDPA)" if sixteen_bit else
            " (fp32: no faster matmuls)") + (", less the backward's recompute of the scores" if backward else ""))

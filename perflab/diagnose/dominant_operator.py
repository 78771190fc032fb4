"""The dominant operator: one op (its forward and the backward autograd made from it) takes a large share of the
device time and runs far from its roofline. Named with its module and line (the operator view), its share, its
roofline place and what perflab/diagnose/operator_facts.py knows about it.

Matmuls, convs and attention are the compute rules' (compute.py, hand-written attention), elementwise ops and copies
the bandwidth rules'; every other op may dominate here. An op with no entry in the facts is named only where its
roofline place is measured (a GPU trace with ceilings), and never as the verdict: with no known replacement its
gain is an upper bound.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from perflab.bottlenecks import COMPUTE_BOUND, MEMORY_BANDWIDTH
from perflab.diagnose.findings import CPU_MAX_CONFIDENCE, Context, Finding, clamp, gain, rounded
from perflab.diagnose.operator_facts import OperatorFact, fact_for
from perflab.diagnose.operators import FLOP_OPS, OperatorRow
from perflab.diagnose.pattern_context import (ATTENTION_MAX_CONFIDENCE, COPY_OPS, MATMULS, POINTWISE,
                                              REFINEMENT_MAX_CONFIDENCE, SOFTMAX, VIEWS)
from perflab.diagnose.pattern_precision import LINEAR_OPS

DOMINANT_SHARE_PCT = 20.0  # of the device time (GPU kernels; on a CPU trace, CPU op time)
FAR_FROM_ROOF_PCT = 50.0  # an op at half its roof or more does what it does well: less work is the only fix
# Ops other rules name (matmul/conv/attention: compute; elementwise, softmax, copies: bandwidth and patterns), and
# the backward nodes of the common layers, by their normalised name (see op_key).
OTHER_RULES_OPS = POINTWISE | COPY_OPS | SOFTMAX | VIEWS | MATMULS | LINEAR_OPS | set(FLOP_OPS)
OTHER_RULES_BACKWARD = {"addmm", "mm", "bmm", "baddbmm", "convolution", "nativelayernorm", "nativebatchnorm",
                        "nativegroupnorm", "cudnnbatchnorm", "mseloss", "nllloss", "logsoftmax",
                        "scaleddotproductflashattention", "scaleddotproductefficientattention", "t", "unsafeview",
                        "accumulategrad"}


@dataclass
class DominantOperator:
    """The operator view's rows of one operator (forward and backward), or of one facts entry."""

    key: str
    fact: Optional[OperatorFact]
    rows: list[OperatorRow]

    @property
    def share_pct(self) -> float:
        return sum(row.share_pct for row in self.rows)

    @property
    def ms_per_step(self) -> float:
        return sum(row.ms_per_step for row in self.rows)

    @property
    def ops(self) -> list[str]:
        return [row.op for row in self.rows]

    @property
    def backward_share_pct(self) -> float:
        return sum(row.share_pct for row in self.rows if is_backward_node(row.op))

    @property
    def where(self) -> tuple[str, Optional[str]]:
        """(module, line) of the costliest forward row (backward rows carry their forward op's module)."""
        forward = [row for row in self.rows if not is_backward_node(row.op)]
        top = (forward or self.rows)[0]
        line = next((row.line for row in forward + self.rows if row.line), None)
        return top.module, line

    @property
    def roof_pct(self) -> Optional[float]:
        """The roofline share of its costliest row that has one (None: not placed)."""
        return next((row.pct_of_roof for row in self.rows if row.pct_of_roof is not None), None)

    @property
    def bound(self) -> str:
        return next((row.bound for row in self.rows if row.pct_of_roof is not None),
                    self.rows[0].bound or "unknown")


def op_key(name: str) -> str:
    """A name shared by a forward op and its backward node: aten::upsample_bicubic2d and UpsampleBicubic2DBackward0
    are both 'upsamplebicubic2d'."""
    bare = re.sub(r"backward\d*$", "", name.lower().removeprefix("aten::"))
    return re.sub(r"[^a-z0-9]", "", bare)


OTHER_RULES_KEYS = OTHER_RULES_BACKWARD | {op_key(name) for name in OTHER_RULES_OPS}


def is_backward_node(name: str) -> bool:
    return re.search(r"Backward\d*$", name) is not None


def group_operators(rows: list[OperatorRow]) -> list[DominantOperator]:
    """The operator view's top ops grouped into operators (a facts entry, or forward + backward of one op), costliest
    first; ops that other rules name are left out."""
    groups: dict[str, DominantOperator] = {}
    for row in rows:
        fact = fact_for(row.op)
        if fact is None and _named_by_other_rules(row):
            continue
        key = fact.name if fact is not None else op_key(row.op)
        groups.setdefault(key, DominantOperator(key, fact, [])).rows.append(row)
    return sorted(groups.values(), key=lambda group: -group.share_pct)


def _named_by_other_rules(row: OperatorRow) -> bool:
    op = row.op
    if row.gflop_per_step or op in OTHER_RULES_OPS or "_foreach_" in op or "_fused_" in op:
        return True
    return op_key(op) in OTHER_RULES_KEYS


def far_from_roof(group: DominantOperator) -> bool:
    """Below FAR_FROM_ROOF_PCT of its roof; a facts entry also when the trace has no ceilings to place it."""
    pct = group.roof_pct
    if pct is None:
        return group.fact is not None
    return pct < FAR_FROM_ROOF_PCT


def dominant_operator(ctx: Context) -> Optional[Finding]:
    view = ctx.operators
    if ctx.profile is None or view is None or not view.ops:
        return None
    found = next((group for group in group_operators(view.ops)
                  if group.share_pct >= DOMINANT_SHARE_PCT and far_from_roof(group)), None)
    return None if found is None else operator_finding(ctx, found, view.time_source)


def roof_text(group: DominantOperator) -> str:
    pct = group.roof_pct
    if pct is None:
        return "its roofline place unknown (no ceilings for this device: `perflab calibrate`)"
    if group.bound == "latency":
        return f"at {pct:.0f}% of its roof (below both roofs: latency-bound)"
    return f"at {pct:.0f}% of its {'compute' if group.bound == 'compute' else 'memory'} roof"


def known_operator_cap(group: DominantOperator) -> float:
    """An operator the facts name is recognised by name, with a known fix: more specific than the class rule that sees
    the same time (memory bandwidth, compute), so it passes that rule's cap by a hair, as hand-written attention
    does. Unplaced on the roofline (a CPU trace, a device without ceilings) it passes the op-mix rules' CPU cap only,
    staying below the direct signals (data wait, syncs)."""
    return ATTENTION_MAX_CONFIDENCE if group.roof_pct is not None else CPU_MAX_CONFIDENCE + 0.01


def operator_finding(ctx: Context, group: DominantOperator, time_source: str) -> Finding:
    """The finding for one dominant operator: headline with module and line, share, roofline place, the facts."""
    module, line = group.where
    step_share = ctx.step_pct(group.ms_per_step)
    fact = group.fact
    place = module + (f", {line}" if line else "")
    name = fact.name if fact is not None else group.ops[0]
    time_text = "GPU kernel time" if time_source == "GPU kernels" else time_source
    summary = (f"{name} ({', '.join(group.ops)}) in {place} takes {group.share_pct:.0f}% of the {time_text}, "
               f"{roof_text(group)}")
    evidence = {"op": group.ops[0], "ops": group.ops, "module": module, "line": line,
                "share_of_device_time_pct": group.share_pct, "share_of_step_pct": step_share,
                "backward_share_pct": group.backward_share_pct, "bound": group.bound,
                "pct_of_roofline": group.roof_pct, "time_source": time_source}
    if fact is not None:
        evidence.update(operator_fact=fact.name, known=fact.known)
        keeps = fact.fix_keeps
        basis = (f"the operator's measured time ({step_share:.0f}% of the step), less the {keeps:.0%} of it that "
                 f"{fact.replacement} would still cost (operator facts: {fact.name})")
        advice = [f"in {place}: {fact.advice[0]}", *fact.advice[1:], f"why: {fact.known}"]
        cls, high = fact.cls, known_operator_cap(group)
    else:
        keeps = (group.roof_pct or 0.0) / 100
        basis = "the operator's measured time above its roofline (upper bound: no known replacement)"
        advice = [f"in {place}: {group.ops[0]} has no entry in perflab's operator facts; look for a cheaper "
                  "equivalent op, or let torch.compile fuse it with its neighbours"]
        cls = COMPUTE_BOUND if group.bound == "compute" else MEMORY_BANDWIDTH
        high = REFINEMENT_MAX_CONFIDENCE
    return Finding(cls=cls, confidence=clamp(0.3 + step_share / 50, high=high), summary=summary,
                   evidence=rounded(evidence), levers=[], advice=advice,
                   expected_gain_pct=gain(step_share * (1 - keeps)), gain_basis=basis)

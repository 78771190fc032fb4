"""What is left to say when a finding's levers were already tried on this run and lost (`tried_and_lost`).

A lever that lost is not proposed again; the finding says instead what its loss teaches: which part of the cost
the lever could not touch, and what acts on that part (each lever declares it: Lever.when_lost).
"""
from __future__ import annotations

from perflab.diagnose.findings import Context, Finding
from perflab.levers import all_levers


def left_when_lost(name: str) -> str:
    """What a lever's loss means, as advice (the cost it left in place, and what acts on that)."""
    lever = next((lever for lever in all_levers() if lever.name == name), None)
    return lever.when_lost if lever is not None else f"{name} lost: it does not address this cost"


def apply_tried_and_lost(ctx: Context, finding: Finding) -> Finding:
    """Drop the levers that lost from a finding's ranking and say what is left, first in its advice."""
    lost = [name for name in finding.levers if name in ctx.tried_and_lost]
    finding.levers = ctx.rank_levers(finding.levers)
    if lost:
        finding.evidence["tried_and_lost"] = lost
        left = [left_when_lost(name) for name in lost]
        finding.advice = left + [advice for advice in finding.advice if advice not in left]
    return finding

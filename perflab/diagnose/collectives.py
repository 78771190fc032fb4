"""Collectives: communication the step waits for. From each rank's trace (perflab/diagnose/communication.py),
the NCCL time not overlapped by compute; the worst rank counts, since every rank waits for it. The rule
fires on its own evidence whatever other rules say: exposed communication above THRESHOLD_PCT of the step.
"""
from __future__ import annotations

from typing import Any, Optional

from perflab.bottlenecks import COLLECTIVES, DDP, FSDP
from perflab.diagnose.communication import communication_profile
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for

THRESHOLD_PCT = 10.0  # exposed (non-overlapped) communication, share of the step time


def communication(ctx: Context) -> Optional[dict[str, Any]]:
    """The worst rank's figures from the gathered result, else this trace's own."""
    gathered = ctx.metrics.collectives
    if gathered:
        return gathered
    profile = communication_profile(ctx.trace)
    return profile.to_dict() if profile is not None else None


def collectives(ctx: Context) -> Optional[Finding]:
    """A finding when exposed communication is at least THRESHOLD_PCT of the step, with the DDP/FSDP levers."""
    comm = communication(ctx)
    if not comm or comm["exposed_share_pct"] < THRESHOLD_PCT:
        return None
    share = comm["exposed_share_pct"]
    levers = levers_for(COLLECTIVES, {FSDP if ctx.config("parallel") == "fsdp" else DDP})
    evidence = {"exposed_communication_pct_of_step": share, "exposed_ms_per_step": comm["exposed_ms_per_step"],
                "communication_ms_per_step": comm["communication_ms_per_step"], "overlap_pct": comm["overlap_pct"]}
    if "worst_rank" in comm:
        evidence["worst_rank"] = comm["worst_rank"]
    return Finding(cls=COLLECTIVES, confidence=clamp(0.45 + share / 100),
                   summary=f"the step waits {comm['exposed_ms_per_step']:.2f} ms ({share:.0f}%) on communication "
                           f"not overlapped with compute ({comm['overlap_pct']:.0f}% of NCCL time overlapped)",
                   evidence=rounded(evidence), levers=ctx.rank_levers(levers),
                   advice=["more compute per all-reduce: a larger per-GPU batch, or --grad-accum N",
                           "check the topology (NVLink vs PCIe) with nvidia-smi topo -m"],
                   expected_gain_pct=gain(share),
                   gain_basis="exposed communication per step (the most that full overlap can hide)")

"""Collectives: communication the step waits for. From each rank's trace (perflab/diagnose/communication.py),
the NCCL time not overlapped by compute, plus the GPU idle while the host waits in a collective or an FSDP hook; the
worst rank counts, since every rank waits for it. The rule fires on its own evidence whatever other rules say:
exposed communication above THRESHOLD_PCT of the step. It names, per rank, the overlap; per kind of collective, the
calls, message sizes and the bus bandwidth achieved against the peak `perflab calibrate --collectives` measured; and
leads with the lever that hides what is exposed.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from perflab.bottlenecks import COLLECTIVES, DDP, FSDP
from perflab.calibrate_collectives import cached_collectives_named
from perflab.diagnose.communication import CollectiveKind, GatheredCommunication, communication_profile
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for

THRESHOLD_PCT = 10.0  # exposed (non-overlapped) communication, share of the step time
NEAR_PEAK_PCT = 70.0  # a collective at this share of the measured peak bus bandwidth is limited by its bytes


def communication(ctx: Context) -> Optional[GatheredCommunication]:
    """The worst rank's figures from the gathered result, else this trace's own."""
    gathered = ctx.metrics.collectives
    if gathered:
        return GatheredCommunication.from_dict(gathered)
    profile = communication_profile(ctx.trace)
    return GatheredCommunication.from_dict(profile.to_dict()) if profile is not None else None


def exposed_share_pct(comm: Union[GatheredCommunication, dict[str, Any]]) -> float:
    """NCCL time not under compute, plus the GPU idle while the host waits on a collective, over the step."""
    if isinstance(comm, dict):  # metrics.collectives as result.json holds it (scripts pass it as it is)
        comm = GatheredCommunication.from_dict(comm)
    host_wait = comm.host_wait_ms_per_step or 0.0
    step = comm.step_ms or 0.0
    return comm.exposed_share_pct + (100 * host_wait / step if step else 0.0)


WAITING_SHARE = 0.25  # a kind's time in collectives spent waiting for the other ranks, named from this share
MOSTLY_WAITING = 0.5  # waiting for the other ranks this share of the NCCL time or more: the slowest rank comes first


def lead_lever(parallel: str, by_kind: dict[str, CollectiveKind],
               peak_gbps: Optional[float]) -> tuple[Optional[str], str]:
    """The lever that should hide the exposed communication, and why: DDP's all-reduce near the link's peak is
    limited by its bytes (bf16 hook), else by when it starts (bucket size); FSDP's all-gathers are hidden by
    prefetch, a reduce-scatter that leads by bf16 reduction."""
    lead_kind = next(iter(by_kind), None)
    if parallel == "fsdp":
        if lead_kind == "reduce_scatter":
            return "fsdp-bf16-reduce", "the gradient reduce-scatter leads: send it in bf16"
        return "fsdp-prefetch", ("the parameter all-gathers lead: prefetch the next blocks, keep the last blocks "
                                 "gathered (--fsdp-no-reshard-last 1)")
    busbw = by_kind["all_reduce"].bus_gbps if "all_reduce" in by_kind else None
    if busbw and peak_gbps and 100 * busbw / peak_gbps >= NEAR_PEAK_PCT:
        return "bf16-comm-hook", (f"the all-reduce runs at {100 * busbw / peak_gbps:.0f}% of the measured peak: "
                                  "its bytes are the limit; halve them")
    return "ddp-bucket-size", "the all-reduce waits for backward to finish: smaller buckets start it earlier"


def collectives(ctx: Context) -> Optional[Finding]:
    """A finding when exposed communication is at least THRESHOLD_PCT of the step, with the DDP/FSDP levers."""
    comm = communication(ctx)
    if comm is None:
        return None
    share = exposed_share_pct(comm)
    if share < THRESHOLD_PCT:
        return None
    parallel = ctx.config("parallel") or "ddp"
    by_kind = comm.by_kind
    measured = cached_collectives_named(ctx.trace.gpu_name if ctx.trace else None, comm.group_size)
    peak = measured.peak_busbw_gbps.get("all_reduce") if measured is not None else None
    levers = levers_for(COLLECTIVES, {FSDP if parallel == "fsdp" else DDP})
    lead, why = lead_lever(parallel, by_kind, peak)
    waiting = sum(figures.waiting_ms_per_step or 0.0 for figures in by_kind.values())
    if waiting >= MOSTLY_WAITING * comm.communication_ms_per_step > 0:
        why = (f"most of it is rank {comm.worst_rank or 0} waiting for the other ranks to arrive "
               f"({waiting:.1f} ms/step): what delays the slowest rank (its own trace, trace.rank<N>.json) comes "
               f"first; then {why}")
    if lead in levers:
        levers = [lead] + [name for name in levers if name != lead]
    evidence = {"exposed_communication_pct_of_step": share, "exposed_ms_per_step": comm.exposed_ms_per_step,
                "host_wait_on_communication_ms_per_step": comm.host_wait_ms_per_step or 0.0,
                "communication_ms_per_step": comm.communication_ms_per_step, "overlap_pct": comm.overlap_pct,
                "collectives": {kind: figures.to_dict() for kind, figures in by_kind.items()}}
    if comm.worst_rank is not None:
        evidence["worst_rank"] = comm.worst_rank
        evidence["overlap_pct_per_rank"] = {str(rank.rank): rank.overlap_pct for rank in comm.per_rank}
    if peak:
        evidence["peak_busbw_gbps"] = peak
        evidence["peak_busbw_source"] = f"perflab calibrate --collectives over {measured.ranks} ranks"
    return Finding(cls=COLLECTIVES, confidence=clamp(0.45 + share / 100),
                   summary=f"exposed communication: the step waits {share:.0f}% of its time on collectives "
                           f"({_kinds_text(by_kind, peak)}; {comm.overlap_pct:.0f}% of NCCL time overlapped); "
                           f"{why}",
                   evidence=rounded(evidence), levers=ctx.rank_levers(levers),
                   advice=["more compute per all-reduce: a larger per-GPU batch, or --grad-accum N",
                           "check the topology (NVLink vs PCIe) with nvidia-smi topo -m"],
                   expected_gain_pct=gain(share),
                   gain_basis="exposed communication per step (the most that full overlap can hide)")


def _kinds_text(by_kind: dict[str, CollectiveKind], peak: Optional[float]) -> str:
    """'all_reduce 12.0 ms/step, 25.0 MB, 180 GB/s bus (48% of peak)' for the two leading kinds: the bus bandwidth
    while moving data where the ranks' traces tell it from the wait (which is named when it is a large part)."""
    parts = []
    for kind, figures in list(by_kind.items())[:2]:
        text = f"{kind} {figures.ms_per_step:.2f} ms/step"
        if figures.mean_message_mb is not None:
            text += f", {figures.mean_message_mb:.1f} MB a call"
        busbw = figures.bus_gbps
        if busbw is not None:
            text += f", {busbw:.0f} GB/s bus"
            if peak:
                text += f" ({100 * busbw / peak:.0f}% of the measured peak)"
        waiting = figures.waiting_ms_per_step or 0.0
        if waiting >= WAITING_SHARE * figures.ms_per_step:
            text += f"; {waiting:.2f} ms/step of it waiting for the other ranks"
        parts.append(text)
    return "; ".join(parts) or "NCCL kernels"

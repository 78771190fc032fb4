"""Collectives: NCCL kernels take a large share of the step (only when the trace has them)."""
from __future__ import annotations

from typing import Optional

from perflab.diagnose.findings import COLLECTIVES, Context, Finding, clamp, gain, rounded

THRESHOLD_PCT = 10.0  # communication share of kernel time


def collectives(ctx: Context) -> Optional[Finding]:
    gpu = ctx.profile.gpu
    share = gpu.kernel_kind_pct.get("communication", 0.0) if gpu else 0.0
    if share < THRESHOLD_PCT:
        return None
    return Finding(cls=COLLECTIVES, confidence=clamp(0.3 + share / 50),
                   summary=f"NCCL collectives take {share:.0f}% of kernel time",
                   evidence=rounded({"communication_kernel_time_pct": share}), levers=[],
                   advice=["overlap communication with compute (DDP bucket size, FSDP prefetch)",
                           "check the topology (NVLink vs PCIe) with nvidia-smi topo -m"],
                   expected_gain_pct=gain(ctx.step_pct(gpu.kernel_ms_per_step * share / 100)),
                   gain_basis="NCCL kernel time per step (upper bound: overlap hides it without removing it)")

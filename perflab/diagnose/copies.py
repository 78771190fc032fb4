"""Host-to-device copies: the GPU waits on input copies (pageable memory, no overlap with compute)."""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import H2D_COPIES, PAGEABLE_COPIES
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.levers import levers_for

THRESHOLD_PCT = 10.0  # GPU idle (no kernel) while host-to-device copies are prepared or in flight


def host_to_device_copies(ctx: Context) -> Optional[Finding]:
    gpu = ctx.profile.gpu
    if gpu is None:
        return None
    rows = [row for row in gpu.memcpy_table if row["kind"].startswith("H2D")]
    idle = gpu.idle_split_pct["waiting on H2D copies"]
    if idle < THRESHOLD_PCT or not rows:
        return None
    copy_ms = sum(row["ms_per_step"] for row in rows)
    pageable_ms = sum(row["ms_per_step"] for row in rows if "pageable" in row["kind"])
    overlap = sum(row["overlap_with_compute_pct"] * row["ms_per_step"] for row in rows) / copy_ms if copy_ms else 0.0
    megabytes = sum(row["mb_per_step"] for row in rows)
    evidence = {"gpu_idle_waiting_on_h2d_pct": idle, "h2d_ms_per_step": copy_ms, "h2d_mb_per_step": megabytes,
                "h2d_gbps": megabytes * 2**20 / (copy_ms * 1e6) if copy_ms else None,
                "pageable_share_pct": 100 * pageable_ms / copy_ms if copy_ms else 0.0,
                "overlap_with_compute_pct": overlap}
    levers = levers_for(H2D_COPIES, {PAGEABLE_COPIES} if pageable_ms > 0.5 * copy_ms else set())
    return Finding(
        cls=H2D_COPIES, confidence=clamp(0.35 + idle / 60 + (0.05 if pageable_ms > 0.5 * copy_ms else 0.0)),
        summary=f"the GPU waited on host-to-device copies {idle:.0f}% of the time ({megabytes:.0f} MB per step, "
                f"{evidence['pageable_share_pct']:.0f}% pageable, {overlap:.0f}% overlapped with compute)",
        evidence=rounded(evidence), levers=levers,
        advice=["copy smaller dtypes (uint8 images) and convert on the GPU",
                "non_blocking copies from pinned memory (perflab's default on CUDA)"],
        expected_gain_pct=gain(idle), gain_basis="GPU idle waiting on host-to-device copies")

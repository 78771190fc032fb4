"""Communication in one rank's trace: NCCL kernel time, the share of it overlapped by compute kernels, and
the exposed (non-overlapped) communication per step, which the step waits for.

NCCL kernels are matched by name prefix, whatever the NCCL version calls them: `ncclKernel_*` (NCCL 2.x),
`ncclDevKernel_*` (NCCL >= 2.19, which HolisticTraceAnalysis missed: its issues #208, #247) and any other
`nccl*`, with or without a `void ` / namespace prefix as some CUPTI versions print them.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from perflab.diagnose.intervals import intervals_of
from perflab.diagnose.trace import ParsedTrace

NCCL_KERNEL = re.compile(r"^\s*(?:void\s+)?(?:[A-Za-z_]\w*::)*nccl", re.IGNORECASE)
TOP_COLLECTIVES = 5


def is_nccl_kernel(name: str) -> bool:
    """True for an NCCL kernel name (ncclKernel_*, ncclDevKernel_*, nccl*), prefixes like `void ` allowed."""
    return bool(NCCL_KERNEL.match(name))


@dataclass
class CommunicationProfile:
    """Per step, in ms: NCCL kernel time (union over streams), the part of it under compute kernels, and the
    exposed rest; `exposed_share_pct` is the exposed time over the step time."""

    steps: int
    step_ms: float
    communication_ms_per_step: float
    overlapped_ms_per_step: float
    exposed_ms_per_step: float
    overlap_pct: float  # overlapped / communication (HolisticTraceAnalysis's comm/compute overlap)
    exposed_share_pct: float
    nccl_kernels_per_step: float
    top_collectives: dict[str, float] = field(default_factory=dict)  # kernel name -> ms per step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def communication_profile(trace: ParsedTrace) -> Optional[CommunicationProfile]:
    """The communication figures of a GPU trace; None when it holds no kernels (a CPU trace)."""
    from perflab.diagnose.summary import step_window  # summary imports this module

    kernels = trace.kernels
    if len(kernels) == 0:
        return None
    start, end, steps = step_window(trace)
    steps = max(steps, 1)
    inside = (kernels.end_us > start) & (kernels.start_us < end)
    nccl = kernels.mask(is_nccl_kernel) & inside
    communication = intervals_of(kernels, nccl).clip(start, end)
    compute = intervals_of(kernels, ~nccl & inside).clip(start, end)
    total_us = communication.total
    overlapped_us = compute.overlap(communication)
    step_ms = (end - start) / 1e3 / steps
    exposed_ms = (total_us - overlapped_us) / 1e3 / steps
    return CommunicationProfile(
        steps=steps, step_ms=step_ms,
        communication_ms_per_step=total_us / 1e3 / steps,
        overlapped_ms_per_step=overlapped_us / 1e3 / steps,
        exposed_ms_per_step=exposed_ms,
        overlap_pct=100 * overlapped_us / total_us if total_us else 0.0,
        exposed_share_pct=100 * exposed_ms / step_ms if step_ms else 0.0,
        nccl_kernels_per_step=float(nccl.sum()) / steps,
        top_collectives=_top_collectives(kernels, nccl, steps),
    )


def _top_collectives(kernels, nccl: np.ndarray, steps: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for index in np.flatnonzero(nccl):
        name = kernels.name(index).split("(")[0]
        totals[name] = totals.get(name, 0.0) + float(kernels.dur_us[index]) / 1e3 / steps
    return dict(sorted(totals.items(), key=lambda item: -item[1])[:TOP_COLLECTIVES])

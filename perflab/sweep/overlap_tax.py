"""The overlap tax of the scaling model: how much a multi-GPU step grows beyond its exposed communication, because
NCCL's kernels share the SMs and the memory bandwidth with the compute they overlap.

Fitted from the smallest multi-GPU point of the scale run (W0 GPUs, with a trusted efficiency E0):

    measured step(W0) = step(1) x 100 / E0            (the 1-GPU breakdown's step, so the units are the model's)
    tax(W0)           = measured step(W0) - step(1) - exposed(W0)
    tax(W)            = tax(W0) x overlapped(W) / overlapped(W0)

exposed(W0) is the point's measured exposed communication where it was profiled (metrics.collectives), else the
model's; overlapped(W) = communication(W) - exposed(W) is the model's communication that runs beside compute. The tax
follows the overlapped communication, not the compute: it is the time NCCL's kernels hold SMs and memory bandwidth
under the compute. Within a node that grows with the collectives' bus factor (2(W-1)/W for DDP's all-reduce: x1.5
from 2 to 4 GPUs, x1.75 at 8), and it can never exceed the compute it overlaps, since overlapped <= backward (DDP) or
forward + backward (FSDP2), so the tax saturates instead of growing without bound past one node. A tax fitted below
zero (the point ran faster than the model) is taken as none. Where the model overlaps no communication at W0, the
tax stays the fitted ms at every count above one GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

NO_MULTI_GPU_POINT = "none: no multi-GPU point measured"


@dataclass(frozen=True)
class OverlapTax:
    """The step's growth beyond exposed communication: ms per ms of overlapped communication, plus a fixed ms."""

    per_overlapped_ms: float = 0.0
    fixed_ms: float = 0.0
    source: str = NO_MULTI_GPU_POINT

    def ms_at(self, gpus: int, overlapped_ms: float) -> float:
        """The tax (ms per step) at `gpus` GPUs whose model overlaps `overlapped_ms` of communication."""
        if gpus <= 1:
            return 0.0
        return self.fixed_ms + self.per_overlapped_ms * max(0.0, overlapped_ms)


NO_TAX = OverlapTax()


def fit_overlap_tax(single_step_ms: float, gpus: int, measured_efficiency_pct: float, communication_ms: float,
                    exposed_ms: float, measured_exposed_ms: Optional[float] = None) -> OverlapTax:
    """The tax from one measured multi-GPU point: its efficiency and the model's communication and exposed ms there
    (`measured_exposed_ms`: the point's profiled exposed communication, which then replaces the model's)."""
    measured_step_ms = single_step_ms * 100 / measured_efficiency_pct
    exposed = exposed_ms if measured_exposed_ms is None else measured_exposed_ms
    exposed_from = "the model's" if measured_exposed_ms is None else "profiled"
    fitted_ms = measured_step_ms - single_step_ms - exposed
    where = f"fitted from the {gpus}-GPU point"
    if fitted_ms <= 0:
        return OverlapTax(source=f"none: {where} grew {measured_step_ms - single_step_ms:.2f} ms/step, no more than "
                                 f"its exposed communication ({exposed_from} {exposed:.2f} ms)")
    overlapped_ms = communication_ms - exposed_ms
    if overlapped_ms <= 0:
        return OverlapTax(fixed_ms=fitted_ms, source=f"{where}: +{fitted_ms:.2f} ms/step at every count (the model "
                                                     f"overlaps no communication there)")
    return OverlapTax(per_overlapped_ms=fitted_ms / overlapped_ms,
                      source=f"{where}: +{fitted_ms:.2f} ms/step ({fitted_ms / overlapped_ms:.2f} ms per ms of "
                             f"overlapped communication, {overlapped_ms:.2f} ms there; {exposed_from} exposed "
                             f"{exposed:.2f} ms)")

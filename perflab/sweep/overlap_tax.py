"""The overlap tax of the scaling model: how much a multi-GPU step grows beyond its exposed communication (NCCL's
kernels sharing the SMs and memory bandwidth with the compute they overlap, the wrapper's hooks, ranks waiting for
each other).

Each measured multi-GPU point (W GPUs, a trusted efficiency E) gives one observation:

    measured step(W) = step(1) x 100 / E            (the 1-GPU breakdown's step, so the units are the model's)
    tax(W)           = measured step(W) - step(1) - exposed(W)

exposed(W) is the point's measured exposed communication where it was profiled (metrics.collectives), else the
model's; overlapped(W) = communication(W) - exposed(W) is the model's communication that runs beside compute.

From one point the tax is held at its fitted ms at every count. Measured on 4x H200 (NVLink, torch 2.11,
2026-11-28, benchmarks/bench_distributed.py), the growth beyond exposed communication went from 2 to 4 GPUs by
x1.07 (resnet50 DDP), x1.19 (the ~1B transformer, DDP) and x0.7 (the same under FSDP2), while the overlapped
communication grew x1.5: carried in proportion to it (this model until then), the 4-GPU predictions erred by -1.0,
-0.4 and -5.3 to -12.1 points; held, by +0.4, +1.4 and -2.2 to -6.4.
From two or more points the tax is a line in the overlapped communication, tax = fixed + slope x overlapped, fitted
by least squares with both terms kept >= 0 (a falling tax is held at the largest count's, and so is one whose change
is within the points' own 95% intervals: two close points would otherwise give a slope from noise). Since overlapped <=
backward (DDP) or forward + backward (FSDP2), the line saturates past one node instead of growing without bound.

A prediction at a measured count uses only the points below it, so each is a check, not a fit of itself.
A point that ran faster than the model (a tax below zero) counts as none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

NO_MULTI_GPU_POINT = "none: no multi-GPU point measured"


@dataclass(frozen=True)
class OverlapTax:
    """The step's growth beyond exposed communication: a fixed ms plus ms per ms of overlapped communication."""

    per_overlapped_ms: float = 0.0
    fixed_ms: float = 0.0
    source: str = NO_MULTI_GPU_POINT

    def ms_at(self, gpus: int, overlapped_ms: float) -> float:
        """The tax (ms per step) at `gpus` GPUs whose model overlaps `overlapped_ms` of communication."""
        if gpus <= 1:
            return 0.0
        return self.fixed_ms + self.per_overlapped_ms * max(0.0, overlapped_ms)


NO_TAX = OverlapTax()


@dataclass(frozen=True)
class TaxPoint:
    """One measured multi-GPU count's observation of the tax."""

    gpus: int
    grew_ms: float  # the measured step's growth over the 1-GPU step
    exposed_ms: float  # the exposed communication taken off it
    exposed_from: str  # "profiled" or "the model's"
    overlapped_ms: float  # the model's communication under compute there
    uncertainty_ms: float = 0.0  # the measured step's own 95% half-interval (0: not known)

    @property
    def tax_ms(self) -> float:
        return max(0.0, self.grew_ms - self.exposed_ms)

    def describe(self) -> str:
        return (f"the {self.gpus}-GPU point grew {self.grew_ms:.2f} ms/step, {self.exposed_from} exposed "
                f"{self.exposed_ms:.2f} ms")


def tax_point(single_step_ms: float, gpus: int, measured_efficiency_pct: float, communication_ms: float,
              exposed_ms: float, measured_exposed_ms: Optional[float] = None,
              uncertainty: Optional[float] = None) -> TaxPoint:
    """One point's observation: its efficiency and the model's communication and exposed ms there
    (`measured_exposed_ms`: the point's profiled exposed communication, which then replaces the model's;
    `uncertainty`: its throughput's 95% half-interval as a share of it)."""
    measured_step_ms = single_step_ms * 100 / measured_efficiency_pct
    exposed = exposed_ms if measured_exposed_ms is None else measured_exposed_ms
    return TaxPoint(gpus=gpus, grew_ms=measured_step_ms - single_step_ms, exposed_ms=exposed,
                    exposed_from="the model's" if measured_exposed_ms is None else "profiled",
                    overlapped_ms=max(0.0, communication_ms - exposed_ms),
                    uncertainty_ms=measured_step_ms * (uncertainty or 0.0))


def fit_overlap_tax(points: list[TaxPoint]) -> OverlapTax:
    """The tax from the measured points: none without one, held from one, a line in the overlapped communication
    from two or more."""
    if not points:
        return NO_TAX
    points = sorted(points, key=lambda point: point.gpus)
    counts = " and ".join(f"{point.gpus}" for point in points)
    where = f"fitted from the {counts}-GPU point{'s' if len(points) > 1 else ''}"
    if all(point.tax_ms <= 0 for point in points):
        return OverlapTax(source=f"none: {where}: {'; '.join(point.describe() for point in points)}, no more than "
                                 "the exposed communication")
    if len(points) == 1:
        point = points[0]
        return OverlapTax(fixed_ms=point.tax_ms, source=f"{where}: +{point.tax_ms:.2f} ms/step, held at every count "
                                                        f"({point.describe()})")
    first, last = points[0], points[-1]
    resolution = math.hypot(first.uncertainty_ms, last.uncertainty_ms)
    if abs(last.tax_ms - first.tax_ms) <= resolution:
        return OverlapTax(fixed_ms=last.tax_ms,
                          source=f"{where}: the tax moved {last.tax_ms - first.tax_ms:+.2f} ms between them, within "
                                 f"their own uncertainty (+/-{resolution:.2f} ms); held at the {last.gpus}-GPU "
                                 f"point's +{last.tax_ms:.2f} ms/step")
    fixed, slope = _line(points)
    if slope <= 0:
        largest = points[-1]
        return OverlapTax(fixed_ms=largest.tax_ms,
                          source=f"{where}: the tax did not grow with the overlapped communication; held at the "
                                 f"{largest.gpus}-GPU point's +{largest.tax_ms:.2f} ms/step "
                                 f"({'; '.join(f'{p.gpus} GPUs +{p.tax_ms:.2f} ms' for p in points)})")
    observed = "; ".join(f"{point.gpus} GPUs +{point.tax_ms:.2f} ms at {point.overlapped_ms:.2f} ms overlapped"
                         for point in points)
    return OverlapTax(per_overlapped_ms=slope, fixed_ms=fixed,
                      source=f"{where}: +{fixed:.2f} ms/step + {slope:.2f} ms per ms of overlapped communication "
                             f"({observed})")


def _line(points: list[TaxPoint]) -> tuple[float, float]:
    """Least squares of tax on overlapped ms, the intercept kept >= 0 (else a line through the origin)."""
    xs = [point.overlapped_ms for point in points]
    ys = [point.tax_ms for point in points]
    n = len(points)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread <= 1e-12:  # the same overlap at every point: no slope to learn
        return mean_y, 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        squares = sum(x * x for x in xs)
        return 0.0, (sum(x * y for x, y in zip(xs, ys)) / squares if squares else 0.0)
    return fixed, slope

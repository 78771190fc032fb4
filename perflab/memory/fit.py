"""The peak at any batch: a fixed part (model states, workspace) plus a per-sample part, fitted by least squares."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np


@dataclass
class PeakFit:
    """peak_mb(batch) = fixed_mb + per_sample_mb * batch, from the measured peaks at a few batches."""

    fixed_mb: float
    per_sample_mb: float
    batches: list[int]
    peaks_mb: list[float]

    def predict_mb(self, batch: int) -> float:
        return self.fixed_mb + self.per_sample_mb * batch

    def largest_batch(self, capacity_mb: Optional[float]) -> Optional[int]:
        """The largest batch whose predicted peak stays within `capacity_mb` (None without a capacity)."""
        return largest_batch(self.fixed_mb, self.per_sample_mb, capacity_mb)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional["PeakFit"]:
        return cls(**data) if data else None


def fit_peaks(batches: Sequence[int], peaks_mb: Sequence[float]) -> PeakFit:
    """Least squares over two or more (batch, peak) pairs."""
    if len(set(batches)) < 2:
        raise ValueError("fitting the peak needs two or more different batch sizes")
    per_sample, fixed = np.polyfit(np.asarray(batches, dtype=float), np.asarray(peaks_mb, dtype=float), 1)
    return PeakFit(float(fixed), float(max(per_sample, 0.0)), list(batches), [float(p) for p in peaks_mb])


def largest_batch(fixed_mb: float, per_sample_mb: float, capacity_mb: Optional[float]) -> Optional[int]:
    if capacity_mb is None or per_sample_mb <= 0:
        return None
    return max(0, math.floor((capacity_mb - fixed_mb) / per_sample_mb))


def fit_batches(batch: int) -> list[int]:
    """The batches a fit measures: a quarter, a half and all of `batch`, at least 2 (BatchNorm trains on no fewer)."""
    batches = sorted({max(2, batch // 4), max(2, batch // 2), batch})
    return batches if len(batches) >= 2 else sorted({1, batch, 2})

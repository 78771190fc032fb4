"""The peak at any batch: a fixed part (model states) plus a per-sample part.

Two models, both lines in the batch:
- `category_fit` (used where the step's categories are known): the fixed part is the model states (parameters,
  gradients, optimizer state) and the per-sample part is the growing categories (activations, inputs,
  temporaries), each taken at the moment of the step where the growing categories are highest (where the peak is
  at a large batch), fitted over the categorised steps. Memory outside the categories (cuDNN/cuBLAS workspace, the
  caching allocator's rounding) is left out: it does not grow with the batch and would tilt a line fitted at small
  batches.
- `fit_peaks`: least squares through torch.cuda.max_memory_allocated at a few small batches. Kept as evidence:
  at small batches the workspace and the optimizer step's phase set the peak, so its slope comes out too low
  (resnet50 on an H100: 16, 32, 64 -> 6172, 7515, 7373 MiB).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from perflab.memory.timeline import CATEGORIES, MODEL_STATES

GROWING = tuple(name for name in CATEGORIES if name not in MODEL_STATES)  # activations, inputs, temporaries
CATEGORY_MODEL = "categories"
RAW_MODEL = "max_memory_allocated"


@dataclass
class PeakFit:
    """peak_mb(batch) = fixed_mb + per_sample_mb * batch; `model` says what was fitted (CATEGORY_MODEL, RAW_MODEL);
    `peaks_mb` are the fitted figures at `batches` (the growing categories for CATEGORY_MODEL)."""

    fixed_mb: float
    per_sample_mb: float
    batches: list[int]
    peaks_mb: list[float]
    model: str = RAW_MODEL
    basis: str = ""
    model_states_mb: Optional[float] = None  # CATEGORY_MODEL: the fixed part's model states
    growing_fixed_mb: float = 0.0  # CATEGORY_MODEL: the growing categories' intercept (>= 0)
    measured_mb: list[float] = field(default_factory=list)  # max_memory_allocated at `batches`, for comparison

    def predict_mb(self, batch: int) -> float:
        return self.fixed_mb + self.per_sample_mb * batch

    def largest_batch(self, capacity_mb: Optional[float]) -> Optional[int]:
        """The largest batch whose predicted peak stays within `capacity_mb` (None without a capacity)."""
        return largest_batch(self.fixed_mb, self.per_sample_mb, capacity_mb)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional["PeakFit"]:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data}) if data else None


def fit_peaks(batches: Sequence[int], peaks_mb: Sequence[float]) -> PeakFit:
    """Least squares over two or more (batch, max_memory_allocated) pairs."""
    if len(set(batches)) < 2:
        raise ValueError("fitting the peak needs two or more different batch sizes")
    per_sample, fixed = np.polyfit(np.asarray(batches, dtype=float), np.asarray(peaks_mb, dtype=float), 1)
    return PeakFit(float(fixed), float(max(per_sample, 0.0)), list(batches), [float(p) for p in peaks_mb],
                   model=RAW_MODEL, basis="least squares through max_memory_allocated", measured_mb=list(peaks_mb))


def growing_moment(breakdown: Any) -> dict[str, float]:
    """The categories at the moment of the step where the growing ones are highest (from its timeline, else at its
    peak): where a larger batch peaks."""
    timeline = breakdown.category_timeline()
    if timeline is None or not timeline.times_ms:
        return dict(breakdown.categories_mb)
    growing = [sum(timeline.mb.get(name, [0.0] * len(timeline.times_ms))[i] for name in GROWING)
               for i in range(len(timeline.times_ms))]
    return timeline.at(max(range(len(growing)), key=growing.__getitem__))


def category_fit(breakdowns: Sequence[Any]) -> PeakFit:
    """Model states + a line through the growing categories of one or more categorised steps (through zero from one
    step; least squares from more, its intercept kept at zero or above)."""
    if not breakdowns:
        raise ValueError("the category model needs one categorised step")
    main = max(breakdowns, key=lambda b: b.batch_size)
    moments = {b.batch_size: growing_moment(b) for b in breakdowns}
    batches = sorted(moments)
    growing = [sum(moments[batch].get(name, 0.0) for name in GROWING) for batch in batches]
    sizes = np.asarray(batches, dtype=float)
    values = np.asarray(growing, dtype=float)
    intercept = 0.0
    if len(batches) >= 2:
        slope, intercept = (float(v) for v in np.polyfit(sizes, values, 1))
    if intercept < 0 or len(batches) < 2:  # through zero: no growing memory at batch 0
        slope, intercept = float(sizes @ values / (sizes @ sizes)), 0.0
    states = sum(moments[main.batch_size].get(name, 0.0) for name in MODEL_STATES)
    measured = {b.batch_size: b.peak_mb for b in breakdowns}
    basis = (f"model states {states:,.1f} MiB + (activations + inputs + temporaries) at their highest moment, "
             f"{'a line through batches ' + ', '.join(map(str, batches)) if len(batches) >= 2 else 'per sample at batch ' + str(batches[0])}"
             "; workspace (cuDNN/cuBLAS) and other memory outside the categories left out")
    return PeakFit(states + intercept, max(slope, 0.0), batches, [float(g) for g in growing], model=CATEGORY_MODEL,
                   basis=basis, model_states_mb=states, growing_fixed_mb=intercept,
                   measured_mb=[float(measured[b]) for b in batches])


def largest_batch(fixed_mb: float, per_sample_mb: float, capacity_mb: Optional[float]) -> Optional[int]:
    if capacity_mb is None or per_sample_mb <= 0:
        return None
    return max(0, math.floor((capacity_mb - fixed_mb) / per_sample_mb))


def fit_batches(batch: int) -> list[int]:
    """The batches a fit measures: a quarter, a half and all of `batch`, at least 2 (BatchNorm trains on no fewer)."""
    batches = sorted({max(2, batch // 4), max(2, batch // 2), batch})
    return batches if len(batches) >= 2 else sorted({1, batch, 2})

"""Interval arithmetic on numpy arrays: union, complement, coverage and point membership. Times in µs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Intervals:
    """Sorted, disjoint [start, end) intervals."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def union(cls, start: np.ndarray, end: np.ndarray) -> "Intervals":
        """Merge possibly overlapping intervals into disjoint ones."""
        start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
        if len(start) == 0:
            return cls(np.empty(0), np.empty(0))
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
        running_end = np.maximum.accumulate(end)
        # a new interval begins where the start lies beyond every earlier end
        begins = np.concatenate(([True], start[1:] > running_end[:-1]))
        group = np.cumsum(begins) - 1
        merged_end = np.zeros(group[-1] + 1)
        np.maximum.at(merged_end, group, end)
        return cls(start[begins], merged_end)

    @classmethod
    def of(cls, *parts: "Intervals") -> "Intervals":
        return cls.union(np.concatenate([p.start for p in parts]), np.concatenate([p.end for p in parts]))

    def __len__(self) -> int:
        return len(self.start)

    @property
    def total(self) -> float:
        return float(np.sum(self.end - self.start))

    def clip(self, lo: float, hi: float) -> "Intervals":
        start, end = np.clip(self.start, lo, hi), np.clip(self.end, lo, hi)
        keep = end > start
        return Intervals(start[keep], end[keep])

    def complement(self, lo: float, hi: float) -> "Intervals":
        """The gaps between these intervals inside [lo, hi)."""
        inside = self.clip(lo, hi)
        starts = np.concatenate(([lo], inside.end))
        ends = np.concatenate((inside.start, [hi]))
        keep = ends > starts
        return Intervals(starts[keep], ends[keep])

    def covered_before(self, t: np.ndarray) -> np.ndarray:
        """For each time in `t`, the total length of these intervals that lies before it."""
        t = np.asarray(t, dtype=np.float64)
        if len(self) == 0:
            return np.zeros_like(t)
        lengths = self.end - self.start
        cumulative = np.concatenate(([0.0], np.cumsum(lengths)))
        index = np.searchsorted(self.start, t, side="right") - 1
        safe = np.clip(index, 0, None)
        partial = np.clip(np.minimum(t, self.end[safe]) - self.start[safe], 0, None)
        return np.where(index >= 0, cumulative[safe] + partial, 0.0)

    def overlap_each(self, other: "Intervals") -> np.ndarray:
        """For each interval of `other`, how much of it these intervals cover."""
        return self.covered_before(other.end) - self.covered_before(other.start)

    def overlap(self, other: "Intervals") -> float:
        return float(np.sum(self.overlap_each(other)))

    def contains(self, t: np.ndarray) -> np.ndarray:
        """Boolean: which times fall inside one of these intervals."""
        t = np.asarray(t, dtype=np.float64)
        if len(self) == 0:
            return np.zeros(t.shape, dtype=bool)
        index = np.searchsorted(self.start, t, side="right") - 1
        safe = np.clip(index, 0, None)
        return (index >= 0) & (t < self.end[safe])


def intervals_of(table, mask=None) -> Intervals:
    """The union of an EventTable's events (optionally a boolean subset)."""
    start, end = table.start_us, table.end_us
    if mask is not None:
        start, end = start[mask], end[mask]
    return Intervals.union(start, end)

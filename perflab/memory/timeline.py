"""Memory over one step by category, from torch.profiler's memory profile (a private API: guarded, with a fallback).

`category_timeline(prof, device)` turns the profiler's tensor lifetimes and categories (parameter, gradient,
optimizer state, activation, input, temporary) into perflab's categories over time; it returns None where the
private API is missing or fails, and the caller falls back to its own accounting (perflab/memory/step.py).
`allocator_increase_mb(prof)` reads the allocator's own running total from the profiler's allocation events,
the CPU's measured peak (CUDA has torch.cuda.max_memory_allocated).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from perflab.profile.capture import quiet_profiler

# perflab's categories, in the order tables and plots show them; the profiler's AUTOGRAD_DETAIL (backward's
# intermediates) and uncategorised tensors count as temporaries
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries")
_FROM_PROFILER = {"PARAMETER": "parameters", "GRADIENT": "gradients", "OPTIMIZER_STATE": "optimizer_state",
                  "ACTIVATION": "activations", "INPUT": "inputs", "TEMPORARY": "temporaries",
                  "AUTOGRAD_DETAIL": "temporaries", None: "temporaries"}
MODEL_STATES = ("parameters", "gradients", "optimizer_state")  # fixed in the batch; the rest grows with it


@dataclass
class CategoryTimeline:
    """MiB by category at each moment of the step (times in ms from its first event)."""

    times_ms: list[float] = field(default_factory=list)
    mb: dict[str, list[float]] = field(default_factory=dict)

    def totals(self, factors: Optional[dict[str, float]] = None) -> list[float]:
        factors = factors or {}
        return [sum(factors.get(name, 1.0) * values[index] for name, values in self.mb.items())
                for index in range(len(self.times_ms))]

    def peak_index(self, factors: Optional[dict[str, float]] = None) -> int:
        totals = self.totals(factors)
        return max(range(len(totals)), key=totals.__getitem__) if totals else 0

    def at(self, index: int) -> dict[str, float]:
        return {name: values[index] for name, values in self.mb.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"times_ms": self.times_ms, "mb": self.mb}

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[CategoryTimeline]:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data}) if data else None


def profiler_options() -> dict[str, Any]:
    """What torch.profiler needs to categorise memory (its memory profile asserts shapes, memory and stacks)."""
    quiet_profiler(torch.cuda.is_available())  # as perflab profile: no Kineto start/stop lines on a CPU run
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return {"activities": activities, "profile_memory": True, "record_shapes": True, "with_stack": True}


def category_timeline(prof: Any, device: torch.device) -> tuple[Optional[CategoryTimeline], str]:
    """The step's memory by category over time, or None and why (the private API is missing or failed)."""
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline
        times_us, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(_device_name(device))
    except Exception as err:  # a private API: any failure means "use the fallback", never a crash
        return None, f"torch.profiler's memory profile is not available here ({type(err).__name__}: {err})"
    if not times_us:
        return None, "torch.profiler's memory profile saw no allocation on this device"
    timeline = CategoryTimeline(times_ms=[(t - times_us[0]) / 1000 for t in times_us],
                                mb={name: [0.0] * len(times_us) for name in CATEGORIES})
    for category, index in _CATEGORY_TO_INDEX.items():
        name = _FROM_PROFILER.get(getattr(category, "name", None), "temporaries")
        column = timeline.mb[name]
        for step, row in enumerate(sizes):
            column[step] += row[index + 1] / 2**20  # the profiler's rows start with an unused slot
    return timeline, "torch.profiler memory timeline (profile_memory=True)"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def allocator_increase_mb(prof: Any) -> Optional[float]:
    """The CPU allocator's largest rise above where it stood when the profiler began, from its allocation events
    (each carries the running total); None where the events cannot be read."""
    try:
        events = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if event.typed[0].name == "Allocation" and event.typed[1].device.type == "cpu":
                events.append((event.start_time_ns, event.typed[1].total_allocated, event.typed[1].alloc_size))
    except Exception:  # private structures: no figure rather than a crash
        return None
    if not events:
        return None
    events.sort()
    _, first_total, first_size = events[0]
    start = first_total - first_size  # the running total before the first event
    return (max(total for _, total, _ in events) - start) / 2**20

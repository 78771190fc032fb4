"""Breakdown: one step's peak memory by category, the measured peak beside it, and the step's memory over time."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from perflab.memory.timeline import CATEGORIES, MODEL_STATES, CategoryTimeline

MEMORY_FILE = "memory.json"


@dataclass
class Breakdown:
    """What used the memory at the peak of one step (MiB), and how each figure was obtained."""

    workload: str
    mode: str
    device: str
    batch_size: int
    precision: str
    peak_mb: float  # measured: torch.cuda.max_memory_allocated, or the CPU allocator's own total
    peak_source: str
    categories_mb: dict[str, float]  # at the peak: parameters ... temporaries (CATEGORIES)
    source: str  # how the categories were obtained (the profiler's memory timeline, or perflab's own accounting)
    reserved_mb: Optional[float] = None  # CUDA: torch.cuda.max_memory_reserved
    total_mb: Optional[float] = None  # the device's memory (or --memory-limit-mb)
    activations: dict[str, Any] = field(default_factory=dict)  # perflab.memory.activations.SavedActivations
    # the same, counted in one forward under bf16 autocast (a train step at fp32/tf32): what bf16 would save
    autocast_activations: dict[str, Any] = field(default_factory=dict)
    # where bf16 is not native to the device (an AVX2-only CPU): one step measured under bf16 autocast, since its
    # backward's conversions cannot be predicted from a forward ({"peak_mb", "categories_mb", "why"})
    autocast_step: dict[str, Any] = field(default_factory=dict)
    timeline: Optional[dict[str, Any]] = None  # CategoryTimeline.to_dict()
    optimizer: Optional[str] = None
    # Adam/AdamW: its state's size under torchao's 8-bit optimizer over its size now, tensor by tensor
    # (perflab/levers/optimizer.py: small tensors stay fp32)
    optimizer_state_8bit_share: Optional[float] = None
    notes: list[str] = field(default_factory=list)

    @property
    def attributed_mb(self) -> float:
        return sum(self.categories_mb.values())

    @property
    def unattributed_mb(self) -> float:
        """The measured peak less the categories' sum: what the accounting missed (or, negative, overcounted)."""
        return self.peak_mb - self.attributed_mb

    @property
    def slack_mb(self) -> Optional[float]:
        """Allocator slack: reserved but not allocated at the peak."""
        return None if self.reserved_mb is None else max(0.0, self.reserved_mb - self.peak_mb)

    @property
    def model_states_mb(self) -> float:
        return sum(self.categories_mb.get(name, 0.0) for name in MODEL_STATES)

    def category_timeline(self) -> Optional[CategoryTimeline]:
        return CategoryTimeline.from_dict(self.timeline)

    def largest_module(self) -> Optional[tuple[str, float]]:
        modules = self.activations.get("by_module_mb") or {}
        return max(modules.items(), key=lambda item: item[1]) if modules else None

    def rows(self) -> list[tuple[str, float]]:
        """(label, MiB) for tables: the categories, slack and what the accounting missed, then the peak."""
        rows = [(name.replace("_", " "), self.categories_mb.get(name, 0.0)) for name in CATEGORIES]
        rows.append(("unattributed (measured - sum)", self.unattributed_mb))
        if self.slack_mb is not None:
            rows.append(("allocator slack (reserved - allocated)", self.slack_mb))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "unattributed_mb": self.unattributed_mb, "slack_mb": self.slack_mb}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Breakdown":
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


def count_saved_activations(breakdown: Breakdown) -> None:
    """Where the profiler's memory timeline put what autograd saved under temporaries (its categoriser missed the
    saved tensors: the transformer on CUDA, torch 2.11), move up to the saved-tensor hooks' count from temporaries
    to activations at each moment, so the levers that shrink activations see them. The totals are unchanged."""
    saved_mb = breakdown.activations.get("total_mb") or 0.0
    timeline = breakdown.category_timeline()
    if timeline is None or saved_mb <= 0 or "activations" not in timeline.mb or "temporaries" not in timeline.mb:
        return
    activations, temporaries = timeline.mb["activations"], timeline.mb["temporaries"]
    if max(activations, default=0.0) >= 0.5 * saved_mb:
        return
    moved = [min(temp, max(0.0, saved_mb - act)) for act, temp in zip(activations, temporaries)]
    timeline.mb["activations"] = [act + move for act, move in zip(activations, moved)]
    timeline.mb["temporaries"] = [temp - move for temp, move in zip(temporaries, moved)]
    breakdown.timeline = timeline.to_dict()
    breakdown.categories_mb = {name: timeline.at(timeline.peak_index()).get(name, 0.0) for name in breakdown.categories_mb}
    breakdown.notes.append(f"the profiler counted the activations as temporaries: up to {saved_mb:,.1f} MiB (what the "
                           "saved-tensor hooks counted) moved to activations at each moment")

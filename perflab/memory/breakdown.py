"""Breakdown: one step's peak memory by category, the measured peak beside it, and the step's memory over time."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from perflab.memory.activations import SavedActivations
from perflab.memory.timeline import CATEGORIES, MODEL_STATES, CategoryTimeline

MEMORY_FILE = "memory.json"


@dataclass
class AutocastStep:
    """One step measured under bf16 autocast where bf16 is not native (its backward's conversions cannot be
    predicted from a forward)."""

    peak_mb: float = 0.0
    categories_mb: dict[str, float] = field(default_factory=dict)
    why: str = ""

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> Optional[AutocastStep]:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data}) if data else None


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
    activations: SavedActivations = field(default_factory=SavedActivations)
    # the same, counted in one forward under bf16 autocast (a train step at fp32/tf32): what bf16 would save
    autocast_activations: Optional[SavedActivations] = None
    # where bf16 is not native to the device (an AVX2-only CPU): one step measured under bf16 autocast
    autocast_step: Optional[AutocastStep] = None
    timeline: Optional[CategoryTimeline] = None
    optimizer: Optional[str] = None
    # Adam/AdamW: its state's size under torchao's 8-bit optimizer over its size now, tensor by tensor
    # (perflab/levers/optimizer.py: small tensors stay fp32)
    optimizer_state_8bit_share: Optional[float] = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:  # memory.json's dicts (an old file, a test's literal) become the typed parts
        if isinstance(self.activations, dict):
            self.activations = SavedActivations.from_dict(self.activations) or SavedActivations()
        if isinstance(self.autocast_activations, dict):
            self.autocast_activations = SavedActivations.from_dict(self.autocast_activations)
        if isinstance(self.autocast_step, dict):
            self.autocast_step = AutocastStep.from_dict(self.autocast_step)
        if isinstance(self.timeline, dict):
            self.timeline = CategoryTimeline.from_dict(self.timeline)

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
        return self.timeline

    def largest_module(self) -> Optional[tuple[str, float]]:
        return self.activations.largest()

    def rows(self) -> list[tuple[str, float]]:
        """(label, MiB) for tables: the categories, slack and what the accounting missed, then the peak."""
        rows = [(name.replace("_", " "), self.categories_mb.get(name, 0.0)) for name in CATEGORIES]
        rows.append(("unattributed (measured - sum)", self.unattributed_mb))
        if self.slack_mb is not None:
            rows.append(("allocator slack (reserved - allocated)", self.slack_mb))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """memory.json's "breakdown": the typed parts as the dicts they always were ({} where there is none)."""
        plain = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {**plain, "activations": self.activations.to_dict(),
                "autocast_activations": self.autocast_activations.to_dict() if self.autocast_activations else {},
                "autocast_step": asdict(self.autocast_step) if self.autocast_step else {},
                "timeline": self.timeline.to_dict() if self.timeline is not None else None,
                "unattributed_mb": self.unattributed_mb, "slack_mb": self.slack_mb}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Breakdown":
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


def count_saved_activations(breakdown: Breakdown) -> None:
    """Where the profiler's memory timeline put what autograd saved under temporaries (its categoriser missed the
    saved tensors: the transformer on CUDA, torch 2.11), move up to the saved-tensor hooks' count from temporaries
    to activations at each moment, so the levers that shrink activations see them. The totals are unchanged."""
    saved_mb = breakdown.activations.total_mb or 0.0
    timeline = breakdown.category_timeline()
    if timeline is None or saved_mb <= 0 or "activations" not in timeline.mb or "temporaries" not in timeline.mb:
        return
    activations, temporaries = timeline.mb["activations"], timeline.mb["temporaries"]
    if max(activations, default=0.0) >= 0.5 * saved_mb:
        return
    moved = [min(temp, max(0.0, saved_mb - act)) for act, temp in zip(activations, temporaries)]
    timeline.mb["activations"] = [act + move for act, move in zip(activations, moved)]
    timeline.mb["temporaries"] = [temp - move for temp, move in zip(temporaries, moved)]
    breakdown.timeline = timeline
    breakdown.categories_mb = {name: timeline.at(timeline.peak_index()).get(name, 0.0) for name in breakdown.categories_mb}
    breakdown.notes.append(f"the profiler counted the activations as temporaries: up to {saved_mb:,.1f} MiB (what the "
                           "saved-tensor hooks counted) moved to activations at each moment")

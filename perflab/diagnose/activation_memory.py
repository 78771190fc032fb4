"""Activation memory: the peak of device memory sits near capacity (or the run ran out of it), so the next batch
size would not fit. Where `perflab memory` saved a breakdown beside the result (memory.json), the finding says what
uses the memory, which module's activations are largest, and what each lever would free."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from perflab.bottlenecks import ACTIVATION_MEMORY, FULL_PRECISION
from perflab.config import is_full_precision
from perflab.diagnose.findings import Context, Finding, clamp, rounded
from perflab.results.records import Record
from perflab.levers import levers_for
from perflab.results.metrics import Memory

THRESHOLD_PCT = 90.0  # peak reserved memory as a share of the device's total
MEMORY_FILE = "memory.json"  # written by perflab memory (perflab/memory/breakdown.py)
LEVER_FLAGS = {"activation checkpointing": "activation-checkpointing", "bf16 autocast": "bf16"}


@dataclass
class SavedModules(Record):
    """The activations saved for backward, by module (MiB), as memory.json's breakdown holds them."""

    by_module_mb: dict[str, float] = field(default_factory=dict)


@dataclass
class SavedPeak(Record):
    """memory.json's breakdown: the measured peak and its categories (MiB)."""

    peak_mb: float = 0.0
    categories_mb: dict[str, float] = field(default_factory=dict)
    activations: SavedModules = field(default_factory=SavedModules)


@dataclass
class SavedLever(Record):
    """One of memory.json's levers: what it frees and the batch it would allow."""

    lever: str = ""
    how: str = ""
    frees_mb: Optional[float] = None
    batch_allowed: Optional[int] = None


@dataclass
class SavedStudy(Record):
    """The parts of memory.json this rule reads. The whole record is perflab.memory.study.MemoryStudy, which the
    diagnosis cannot import (perflab.memory imports the levers, which import the diagnosis)."""

    breakdown: SavedPeak = field(default_factory=SavedPeak)
    levers: list[SavedLever] = field(default_factory=list)


def saved_breakdown(ctx: Context) -> Optional[SavedStudy]:
    """memory.json of `perflab memory` in the result's folder, when there is one."""
    path = getattr(ctx.result, "path", None)
    if not path:
        return None
    study_path = Path(path).parent / MEMORY_FILE
    try:
        study = json.loads(study_path.read_text()) if study_path.is_file() else None
    except (OSError, ValueError):
        return None
    return SavedStudy.from_dict(study) if isinstance(study, dict) else None


def activation_memory(ctx: Context) -> Optional[Finding]:
    memory = ctx.metrics.memory or Memory()
    peak_mb, total_mb = memory.peak_reserved_mb, memory.device_total_mb
    source = "result.json (torch.cuda.max_memory_reserved)"
    if not (peak_mb and total_mb) and ctx.trace is not None and ctx.trace.memory_peaks:
        peak_mb, total_mb = ctx.trace.memory_peaks.get("reserved_mb"), ctx.trace.gpu_total_mb
        source = "trace memory events (profile_memory)"
    out_of_memory = getattr(ctx.result, "out_of_memory", None) if ctx.result is not None else None
    if out_of_memory:
        peak_mb = out_of_memory.get("reserved_mb") or peak_mb
        total_mb = out_of_memory.get("total_mb") or total_mb
        source = "the run ran out of memory (result.json status oom)"
    if not (peak_mb and total_mb):
        return None
    used_pct = 100 * peak_mb / total_mb
    if used_pct < THRESHOLD_PCT and not out_of_memory:
        return None
    full_precision = is_full_precision(ctx.config("precision", "fp32"))
    levers = levers_for(ACTIVATION_MEMORY, {FULL_PRECISION} if full_precision else set())
    evidence = {"peak_reserved_mb": float(peak_mb), "device_total_mb": float(total_mb), "used_pct": used_pct,
                "source": source}
    summary = (f"peak device memory {peak_mb:,.0f} MiB is {used_pct:.0f}% of {total_mb:,.0f} MiB: the next batch "
               "size will not fit") if not out_of_memory else f"the run ran out of memory: {ctx.result.status_reason}"
    advice = ["a smaller batch (with gradient accumulation to keep the effective one)"]
    study = saved_breakdown(ctx)
    if study is not None:
        summary, levers, advice = _with_breakdown(study, summary, levers, advice, evidence)
    return Finding(
        cls=ACTIVATION_MEMORY, confidence=1.0 if out_of_memory else clamp(0.5 + (used_pct - THRESHOLD_PCT) / 20),
        summary=summary, evidence=rounded(evidence), levers=levers, advice=advice,
        expected_gain_pct=0.0, gain_basis="none in time: memory limits the batch size, not this step's speed")


def _with_breakdown(study: SavedStudy, summary: str, levers: list[str], advice: list[str],
                    evidence: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """The finding with perflab memory's numbers: the peak's categories, the largest module, the levers by what
    they free (most first)."""
    breakdown = study.breakdown
    categories = breakdown.categories_mb
    peak = breakdown.peak_mb or 1.0
    activations = categories.get("activations", 0.0)
    evidence.update({f"{name}_mb": mb for name, mb in categories.items()})
    evidence.update(activations_pct=100 * activations / peak, breakdown_source="memory.json (perflab memory)")
    modules = breakdown.activations.by_module_mb
    largest = max(modules.items(), key=lambda item: item[1]) if modules else None
    summary += f"; activations are {100 * activations / peak:.0f}% of the {peak:,.0f} MiB peak"
    if largest:
        summary += f", the largest in {largest[0]} ({largest[1]:,.0f} MiB)"
    ranked = sorted(study.levers, key=lambda lever: -(lever.frees_mb or 0.0))
    advice = [f"{lever.lever} ({lever.how}) frees {lever.frees_mb:,.0f} MiB"
              + (f", batch {lever.batch_allowed} would fit" if lever.batch_allowed else "")
              for lever in ranked if (lever.frees_mb or 0.0) > 0][:4] + advice
    order = [LEVER_FLAGS[lever.lever] for lever in ranked if lever.lever in LEVER_FLAGS]
    levers = order + [lever for lever in levers if lever not in order]
    return summary, levers, advice

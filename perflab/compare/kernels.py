"""The kernels whose GPU time per step changed most between two runs, read from both runs' traces."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from perflab.diagnose.trace import step_window
from perflab.diagnose.trace import load_trace
from perflab.errors import PerflabError
from perflab.results import Result


def trace_path(result: Result) -> Optional[Path]:
    if not result.path:
        return None
    directory = Path(result.path).parent
    names = [result.artifacts.get("trace")] if getattr(result, "artifacts", None) else []
    for name in names + ["trace.json", "trace.json.gz"]:
        if name and (directory / name).is_file():
            return directory / name
    return None


def kernel_ms_per_step(path: Path) -> dict[str, float]:
    """GPU time per profiled step of each kernel name in a trace (empty for a CPU-only trace)."""
    trace = load_trace(path)
    kernels = trace.kernels
    steps = max(step_window(trace)[2], 1)
    totals = np.bincount(kernels.name_id, weights=kernels.dur_us, minlength=len(kernels.names)) if len(kernels) \
        else np.zeros(0)
    return {name: float(totals[i]) / 1e3 / steps for i, name in enumerate(kernels.names) if i < totals.size}


@dataclass
class KernelChange:
    """GPU time per profiled step of one kernel, base vs candidate."""

    kernel: str
    base_ms: float
    candidate_ms: float
    delta_ms: float


def kernel_changes(base: Result, cand: Result, top: int = 12) -> tuple[Optional[list[KernelChange]], str]:
    """The kernels whose GPU time per step changed most, from both runs' traces (perflab.diagnose.trace)."""
    paths = trace_path(base), trace_path(cand)
    if not all(paths):
        return None, "kernels: not compared (both runs need a trace: record them with `perflab profile`)"
    try:
        base_kernels, cand_kernels = kernel_ms_per_step(paths[0]), kernel_ms_per_step(paths[1])
    except ImportError:
        return None, "kernels: not compared (this perflab has no trace parser, perflab.diagnose.trace)"
    except PerflabError as err:
        return None, f"kernels: not compared ({err})"
    if not base_kernels and not cand_kernels:
        return None, "kernels: not compared (the traces hold no GPU kernels: CPU runs)"
    rows = [KernelChange(name, base_kernels.get(name, 0.0), cand_kernels.get(name, 0.0),
                         cand_kernels.get(name, 0.0) - base_kernels.get(name, 0.0))
            for name in set(base_kernels) | set(cand_kernels)]
    rows.sort(key=lambda row: -abs(row.delta_ms))
    return rows[:top], (f"kernels: GPU time per profiled step from {paths[0].name} and {paths[1].name}; "
                        f"top {min(top, len(rows))} of {len(rows)} by absolute change")

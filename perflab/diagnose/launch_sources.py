"""Who launches the kernels: a step's kernel launches (on a CPU trace, its op calls) counted by phase (forward,
backward, optimizer: perflab's phase ranges, else autograd's backward nodes and torch's `Optimizer.step#` ranges)
and by module, with the optimizer's class and implementation (single-tensor, foreach, fused)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.diagnose.findings import Context
from perflab.diagnose.intervals import intervals_of
from perflab.diagnose.op_graph import OpCall
from perflab.diagnose.operators import module_shape
from perflab.diagnose.phases import phase_intervals

LAUNCH_PHASES = ("forward", "backward", "optimizer")
OPTIMIZER_STEP_MARK = "Optimizer.step#"  # torch.optim's own range: Optimizer.step#Adam.step
OTHER = "other"
TOP_MODULES = 3


@dataclass
class LaunchSources:
    """Launches per step: in all, by phase (LAUNCH_PHASES, then 'other'), by module (costliest first)."""

    unit: str  # "kernels" (GPU trace) or "op calls" (CPU trace: top-level op calls)
    per_step: float
    by_phase: dict[str, float] = field(default_factory=dict)
    by_module: dict[str, float] = field(default_factory=dict)
    optimizer: Optional[str] = None  # "Adam(foreach=False)", "AdamW(fused)"; None without an optimizer step

    def share_pct(self, phase: str) -> float:
        return 100 * self.by_phase.get(phase, 0.0) / self.per_step if self.per_step else 0.0

    @property
    def top_phase(self) -> Optional[str]:
        counted = {phase: count for phase, count in self.by_phase.items() if phase != OTHER and count > 0}
        return max(counted, key=counted.get) if counted else None

    @property
    def optimizer_dominates(self) -> bool:
        """The optimizer launches more than forward and backward each, and is not fused already: its implementation
        is the first lever."""
        return self.top_phase == "optimizer" and not (self.optimizer or "").endswith("(fused)")

    def phase_text(self, phase: str) -> str:
        text = f"{phase}: {self.by_phase.get(phase, 0.0):,.0f} of {self.per_step:,.0f} {self.unit}"
        return text + (f", {self.optimizer}" if phase == "optimizer" and self.optimizer else "")

    def text(self) -> str:
        """'optimizer: 3,000 of 6,900 kernels, Adam(foreach=False); backward 2,400; forward 1,500', largest first."""
        phases = sorted((p for p, n in self.by_phase.items() if n >= 0.5), key=lambda p: -self.by_phase[p])
        if not phases:
            return ""
        rest = [f"{phase} {self.by_phase[phase]:,.0f}" for phase in phases[1:]]
        return "; ".join([self.phase_text(phases[0]), *rest])


def launch_sources(ctx: Context) -> Optional[LaunchSources]:
    """The launches of the profiled steps by phase and module; None without an op graph."""
    graph, profile = ctx.graph, ctx.profile
    if graph is None or profile is None or not graph.calls:
        return None
    steps = max(profile.steps, 1)
    on_gpu = ctx.trace.has_gpu
    phases = call_phases(ctx, graph.calls)
    counts = np.array([call.kernels if on_gpu else 1 for call in graph.calls], dtype=np.float64)
    per_step = profile.gpu.kernels_per_step if on_gpu and profile.gpu else counts.sum() / steps
    by_phase = {phase: float(counts[phases == phase].sum()) / steps for phase in LAUNCH_PHASES}
    by_phase[OTHER] = max(0.0, per_step - sum(by_phase.values()))
    by_module: dict[str, float] = {}
    for call, phase, count in zip(graph.calls, phases, counts):
        module = "optimizer" if phase == "optimizer" else module_of(call)
        by_module[module] = by_module.get(module, 0.0) + count / steps
    top = dict(sorted(by_module.items(), key=lambda item: -item[1])[:TOP_MODULES])
    return LaunchSources(unit="kernels" if on_gpu else "op calls", per_step=float(per_step), by_phase=by_phase,
                         by_module=top, optimizer=optimizer_label(ctx, graph.calls, phases))


def module_of(call: OpCall) -> str:
    """The module a call ran in, repeated blocks starred; autograd's gradient accumulation by its name."""
    if call.module:
        return module_shape(call.module)
    return "AccumulateGrad" if call.name.endswith("AccumulateGrad") else "(no module)"


def call_phases(ctx: Context, calls: list[OpCall]) -> np.ndarray:
    """Each call's phase: the perflab phase range it starts in; else the optimizer's own range, a backward node's
    'backward', or 'other'."""
    trace = ctx.trace
    starts = np.array([call.start_us for call in calls])
    phases = np.full(len(calls), OTHER, dtype=object)
    ann = trace.annotations
    optimizer_ranges = intervals_of(ann, ann.mask(lambda name: name.startswith(OPTIMIZER_STEP_MARK)))
    phases[optimizer_ranges.contains(starts)] = "optimizer"
    phases[np.array([call.backward for call in calls]) & (phases == OTHER)] = "backward"
    for phase in LAUNCH_PHASES:  # perflab's ranges, where the step wore them, decide
        inside = phase_intervals(trace, (phase,)).contains(starts)
        phases[inside] = phase
    return phases


def optimizer_label(ctx: Context, calls: list[OpCall], phases: np.ndarray) -> Optional[str]:
    """The optimizer's class and implementation as the trace shows them: 'Adam(foreach=False)'."""
    marks = [name for name in ctx.trace.annotations.names if name.startswith(OPTIMIZER_STEP_MARK)]
    names = [call.name for call, phase in zip(calls, phases) if phase == "optimizer"]
    if not marks and not names:
        return None
    cls = marks[0].removeprefix(OPTIMIZER_STEP_MARK).split(".")[0] if marks else "the optimizer"
    if any("_fused_" in name for name in names):
        return f"{cls}(fused)"
    if any("_foreach_" in name for name in names):
        return f"{cls}(foreach)"
    return f"{cls}(foreach=False)"

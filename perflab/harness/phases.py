"""The phases of a step, declared once, in the order a step runs them.

Timers, markers, the diagnosis and every report read this list, so a new phase is added here and
appears everywhere in the same place.
"""
from __future__ import annotations

# Measured phases in step order; "checkpoint" is timed only on checkpointing steps, and "unattributed" is the
# step time no phase covers (computed after the trial, not timed).
PHASE_ORDER = ("data_wait", "h2d", "augment", "forward", "backward", "optimizer", "step", "checkpoint",
               "unattributed")
# The phases whose host time is the model's own work (not waiting for data or copying it).
COMPUTE_PHASES = ("augment", "forward", "backward", "optimizer", "step")
# The profiler/NVTX range of a phase, where it differs from the phase name (traces already recorded use "data").
_MARKER_NAMES = {"data_wait": "data"}


def marker_name(phase: str) -> str:
    """The name of the NVTX / torch.profiler range the timed loop wears around `phase`."""
    return _MARKER_NAMES.get(phase, phase)


# The ranges the timed loop marks in a trace, in step order (checkpoint and unattributed are not marked).
MARKED_PHASES = tuple(marker_name(phase) for phase in PHASE_ORDER if phase not in ("checkpoint", "unattributed"))


def phase_sort_key(name: str) -> tuple[int, str]:
    """Sort key putting phases in step order; unknown names (a plugin's own) after, alphabetically."""
    return (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER), name)

"""The phases of a step, declared once, in the order a step runs them.

Timers, markers, the diagnosis and every report read this list, so a new phase is added here and
appears everywhere in the same place.
"""
from __future__ import annotations

# Measured phases in step order; "checkpoint" is timed only on checkpointing steps, and "unattributed" is the
# step time no phase covers (computed after the trial, not timed). "generate" and "first_token" are a workload's own
# generation loop called whole, for all of a request's tokens and for one (perflab/generation/loop_timing.py).
PHASE_ORDER = ("data_wait", "h2d", "augment", "prefill", "decode", "generate", "first_token", "forward", "backward",
               "optimizer", "step", "checkpoint", "unattributed")
# The phases whose host time is the model's own work (not waiting for data or copying it).
COMPUTE_PHASES = ("augment", "prefill", "decode", "generate", "first_token", "forward", "backward", "optimizer",
                  "step")
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


def phase_shares(phases_ms: dict[str, float], step_ms: float) -> dict[str, float]:
    """Each phase's share of the step, in %, from one aggregate (the mean per step of phases and step alike).

    Phases timed on the host clock are disjoint parts of their step, so they fit in it. On CUDA the data wait is
    host time while the device may still run the previous step's work: phases that overlap like that sum to more
    than the step, and then each is a share of the summed phase time. Either way the shares add up to 100% at most.
    """
    if not step_ms or step_ms <= 0:
        return {}
    whole = max(step_ms, sum(phases_ms.values()))
    shares = {name: 100 * ms / whole for name, ms in phases_ms.items()}
    check_shares(shares, "phase shares of the step")
    return shares


def check_shares(shares_pct: dict[str, float], what: str) -> None:
    """Raise on shares of one whole that add up to more than 100% (or hold a negative one): a bug, never a figure."""
    total = sum(shares_pct.values())
    if total > 100 + 1e-6 or any(share < 0 for share in shares_pct.values()):
        listed = ", ".join(f"{name} {share:.1f}%" for name, share in shares_pct.items())
        raise ValueError(f"bug: {what} add up to {total:.1f}% ({listed}); shares of one whole cannot exceed 100%")

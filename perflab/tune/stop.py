"""Why a tune stopped, as a value (a kind and its detail), and the stop line rendered from it and the outcome.

The stop line agrees with the best: it names what was kept, any screened win left unconfirmed, a profile that was
cut, and trials that were never judged; "no lever won" becomes "inconclusive: ..." when the start's own throughput
moves more than a screen's threshold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class StopKind(str, Enum):
    NEAR_PEAK = "near the peak"
    NO_LEVER_WON = "no lever won"
    NO_SETTING_WON = "no lever or serve setting won"
    NO_LEVER_LEFT = "no lever left to try"
    BUDGET_SPENT = "budget spent"
    BUDGET_NEARLY_SPENT = "budget nearly spent"
    MAX_TRIALS = "max trials"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class StopReason:
    """Why the search ended: its kind, and the numbers or words behind it."""

    kind: StopKind
    detail: str = ""

    def text(self, further: bool = False) -> str:
        """The reason as the stop line begins; `further`: something was kept, so 'no further lever won'."""
        if self.kind == StopKind.MAX_TRIALS:
            return f"--max-trials {self.detail} reached"
        if self.kind == StopKind.NO_LEVER_LEFT:
            return self.kind.value + (f" for {self.detail}" if self.detail else "")
        head = self.kind.value
        if further and self.kind in (StopKind.NO_LEVER_WON, StopKind.NO_SETTING_WON):
            head = head.replace("no lever", "no further lever", 1)
        return f"{head}: {self.detail}" if self.detail else head

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.name.lower(), "detail": self.detail}


@dataclass
class StopContext:
    """What the stop line reports beside the reason: the best, what was kept or left, and what was not judged."""

    best_label: Optional[str]
    kept: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)  # the diagnosis's advice (what is the user's to do)
    unconfirmed: list[str] = field(default_factory=list)  # screened wins left unconfirmed, described
    noise: Optional[str] = None  # why 'no lever won' is inconclusive (the start moves more than a screen's threshold)
    profile_cut: Optional[str] = None  # the profile was cut at its limit: what tune did instead
    unjudged: Optional[str] = None


def stop_line(reason: StopReason, context: StopContext) -> str:
    """The one line tune.json, the summary and the report give for why the search stopped."""
    line = reason.text(further=bool(context.kept))
    if not context.kept and reason.kind == StopKind.NO_LEVER_WON and context.noise:
        line = f"inconclusive: {line}, {context.noise}"
    if context.advice and (not context.kept or reason.kind == StopKind.NO_LEVER_LEFT):
        line += f"; the diagnosis advises: {context.advice[0]}"  # what is left to do is the user's, not a lever's
    if context.best_label is not None:
        line += f"; best: {context.best_label} (kept: {', '.join(context.kept) if context.kept else 'nothing'})"
    for part in (*context.unconfirmed, context.profile_cut, context.unjudged):
        if part:
            line += f"; {part}"
    return line


"""Did a repeat reproduce its original? compare's decision says: only "no significant change" reproduces it."""
from __future__ import annotations

from perflab.compare.decision import INCONCLUSIVE, NO_CHANGE, NOT_JUDGED, Comparison

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"


def reproduction(comparison: Comparison) -> tuple[str, str]:
    """(reproduced | not reproduced | inconclusive, why), from compare's decision on (original, repeat)."""
    why = "; ".join(comparison.reasons)
    if comparison.decision == NO_CHANGE:
        return REPRODUCED, why
    if comparison.decision in (NOT_JUDGED, INCONCLUSIVE):
        return INCONCLUSIVE, why
    return NOT_REPRODUCED, why  # accept or reject: a significant change beyond the minimum effect, or a quality fail

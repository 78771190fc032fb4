"""torch's own anti-pattern matcher, as a minor finding: what the capture (profile/torch_patterns.py) saved
beside the trace, where the installed torch has the matcher. perflab's own rules (patterns.py) never depend on it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from perflab.diagnose.findings import Context, Finding, rounded
from perflab.profile.torch_patterns import TORCH_PATTERNS_FILE


def torch_matcher_finding(ctx: Context) -> Optional[Finding]:
    """A minor finding listing torch's matches, when the capture saved some next to the trace."""
    if ctx.trace is None:
        return None
    path = Path(ctx.trace.path).parent / TORCH_PATTERNS_FILE
    if not path.is_file():
        return None
    try:
        matches = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not matches:
        return None
    counts: dict[str, int] = {}
    for match in matches:
        counts[match["pattern"]] = counts.get(match["pattern"], 0) + 1
    first = matches[0]
    return Finding(cls="memory bandwidth", confidence=0.3,
                   summary="torch's anti-pattern matcher: " + ", ".join(f"{n}x {p}" for p, n in counts.items()),
                   evidence=rounded({"op": first["op"], "line": first.get("source"), "module": None,
                                     "matches_by_pattern": counts}),
                   levers=[], advice=list(dict.fromkeys(m["advice"] for m in matches if m.get("advice")))[:4],
                   expected_gain_pct=0.0, gain_basis="not measured by torch's matcher")

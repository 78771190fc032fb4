"""torch's own anti-pattern matcher (torch.profiler._pattern_matcher), where the installed torch has it.

It is private and absent from some versions (2.14 has none), and it reads the live profiler's event tree, not a
saved trace: the capture runs it once when the trace is written and keeps what it matched beside the trace
(TORCH_PATTERNS_FILE); `perflab diagnose` adds that as a minor finding. perflab's own rules (patterns.py) never
depend on it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from perflab.diagnose.findings import Context, Finding, rounded

TORCH_PATTERNS_FILE = "torch_anti_patterns.json"
PATTERN_CLASSES = ("ExtraCUDACopyPattern", "ForLoopIndexingPattern", "FP32MatMulPattern",
                   "OptimizerSingleTensorPattern", "SynchronizedDataLoaderPattern", "GradNotSetToNonePattern",
                   "Conv2dBiasFollowedByBatchNorm2dPattern", "MatMulDimInFP16Pattern")


def run_torch_matcher(prof) -> Optional[list[dict[str, Any]]]:
    """What torch's matcher finds in a finished torch.profiler.profile; None where it is missing or fails."""
    try:
        from torch.profiler import _pattern_matcher as matcher
    except ImportError:
        return None
    found = []
    try:
        for name in PATTERN_CLASSES:
            cls = getattr(matcher, name, None)
            if cls is None:
                continue
            pattern = cls(prof, should_benchmark=False)
            for event in pattern.matched_events():
                where = getattr(matcher, "source_code_location", lambda _e: None)(event)
                found.append({"pattern": getattr(pattern, "name", name), "op": getattr(event, "name", "?"),
                              "source": where, "advice": getattr(pattern, "description", "")})
    except Exception:  # private API: any change in it must not cost the user the trace
        return None
    return found


def save_torch_matches(prof, out_dir: Path) -> Optional[Path]:
    matches = run_torch_matcher(prof)
    if matches is None:
        return None
    path = Path(out_dir) / TORCH_PATTERNS_FILE
    path.write_text(json.dumps(matches, indent=1))
    return path


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

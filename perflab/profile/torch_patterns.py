"""Run torch's own anti-pattern matcher (torch.profiler._pattern_matcher) on the live profiler, where torch has it.

It is private and absent from some versions (2.14 has none), and it reads the live profiler's event tree, not a
saved trace: the capture runs it once when the trace is written and keeps what it matched beside the trace
(TORCH_PATTERNS_FILE); diagnose/torch_matcher.py turns that file into a minor finding.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

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
    """Write what torch's matcher finds next to the trace; None where it found nothing to say."""
    matches = run_torch_matcher(prof)
    if matches is None:
        return None
    path = Path(out_dir) / TORCH_PATTERNS_FILE
    path.write_text(json.dumps(matches, indent=1))
    return path

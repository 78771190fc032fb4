"""Helpers for benchmark areas: argument parsing, rows, and running perflab configs in-process."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args()


class Rows:
    """Collects result rows and rewrites rows.json after each one, so a timeout keeps what finished."""

    def __init__(self, area: str, out: Path):
        self.area = area
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []

    def add(self, experiment: str, metric: str, value: Optional[float], unit: str = "", note: str = "") -> None:
        self.rows.append({"area": self.area, "experiment": experiment, "metric": metric, "value": value,
                          "unit": unit, "note": note})
        print(f"[{self.area}] {experiment} {metric} = {value} {unit} {note}", flush=True)
        (self.out / "rows.json").write_text(json.dumps(self.rows, indent=1))


def cpu_ticks() -> list[int]:
    """All CPUs' time since boot by kind, from /proc/stat's first line: user, nice, system, idle, iowait, irq,
    softirq, steal, ... (jiffies)."""
    with open("/proc/stat") as stat:
        return [int(field) for field in stat.readline().split()[1:]]

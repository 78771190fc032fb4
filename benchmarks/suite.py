"""The GPU suite: every benchmark area in one call, a short table last.

    python benchmarks/suite.py --out $OUT [--only core,levers] [--quick]

Each area is a module `benchmarks/bench_<area>.py` with `run(out: Path, quick: bool) -> list[dict]`;
each row has area, experiment, metric, value, unit and note. Areas run one after another in their own
process (so global CUDA state and memory do not leak between them), each under a time limit. The
suite writes suite.json (all rows) and, as each area ends, <area>.tar.gz (its files: results, traces,
plots), so a device call brings back everything in a few files even if it is cut short.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def discover_areas() -> list[str]:
    return sorted(p.stem[len("bench_"):] for p in HERE.glob("bench_*.py"))


def run_area(area: str, out: Path, quick: bool, timeout_s: int) -> list[dict]:
    area_out = out / area
    area_out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", f"benchmarks.bench_{area}", "--out", str(area_out)]
    if quick:
        command.append("--quick")
    began = time.time()
    print(f"=== {area}: {' '.join(command)}", flush=True)
    try:
        done = subprocess.run(command, cwd=ROOT, timeout=timeout_s)
        status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
    except subprocess.TimeoutExpired:
        status = f"timeout after {timeout_s}s"
    rows_file = area_out / "rows.json"
    rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    print(f"=== {area}: {status} in {time.time() - began:.0f}s, {len(rows)} rows", flush=True)
    if status != "ok":
        rows.append({"area": area, "experiment": "(area)", "metric": "status", "value": None, "unit": "",
                     "note": status})
    return rows


def print_table(rows: list[dict]) -> None:
    print("\narea | experiment | metric | value | note")
    for row in rows:
        value = row.get("value")
        text = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
        print(f"{row['area']} | {row['experiment']} | {row['metric']} | {text} {row.get('unit', '')} | "
              f"{row.get('note', '')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated areas (default: all)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--area-timeout", type=int, default=420)
    args = parser.parse_args()
    areas = [a for a in args.only.split(",") if a] or discover_areas()
    work = args.out / "work"
    rows: list[dict] = []
    for area in areas:
        rows += run_area(area, work, args.quick, args.area_timeout)
        (args.out / "suite.json").write_text(json.dumps(rows, indent=1))
        with tarfile.open(args.out / f"{area}.tar.gz", "w:gz") as tar:
            tar.add(work / area, arcname=area)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

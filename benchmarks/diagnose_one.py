"""Profile and diagnose some planted workloads only: `python -m benchmarks.diagnose_one --out DIR NAME...`.

Re-records one GPU trace fixture without the whole diagnose area. `--size N` overrides the workload's size.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_diagnose import CLASS_SLUGS, PLANTED, PLANTED_RUNS, profile_one
from benchmarks.common import Rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    rows = Rows("diagnose", args.out)
    for name, workload_file, changes in PLANTED_RUNS:
        if name not in args.names:
            continue
        changes = dict(changes)
        if args.size:
            changes["workload_options"] = {"size": args.size}
        if args.batch:
            changes["batch_size"] = args.batch
        profile_one(rows, args.out, name, str(PLANTED / workload_file), changes, CLASS_SLUGS[name.split("__")[0]])


if __name__ == "__main__":
    main()

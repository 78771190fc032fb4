"""Profile and diagnose some planted workloads only: `python -m benchmarks.diagnose_one --out DIR NAME...`.

Re-records one GPU trace fixture without the whole diagnose area (NAME as in bench_diagnose.PLANTED_RUNS, e.g.
`sync__cpu_per_block sync__nonzero_router`); the fixtures land in DIR/fixtures/, ready to copy to
tests/fixtures/traces/gpu/ (cpu/ on a CPU run). `--size N` overrides the workload's size.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_diagnose import CLASS_SLUGS, PLANTED, PLANTED_RUNS, fixture_name, profile_one
from benchmarks.common import Rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    rows = Rows("diagnose", args.out)
    unknown = set(args.names) - {name for name, _, _ in PLANTED_RUNS}
    if unknown:
        parser.error(f"unknown name(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(name for name, _, _ in PLANTED_RUNS)}")
    for name, workload_file, changes in PLANTED_RUNS:
        if name not in args.names:
            continue
        name = fixture_name(name)
        changes = dict(changes)
        if args.size:
            changes["workload_options"] = {"size": args.size}
        if args.batch:
            changes["batch_size"] = args.batch
        profile_one(rows, args.out, name, str(PLANTED / workload_file), changes, CLASS_SLUGS[name.split("__")[0]])


if __name__ == "__main__":
    main()

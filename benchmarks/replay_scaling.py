"""The scaling model again over a scale run's saved points, with the model as it is now: for a scale folder copied
back from the device (scale.json, sweep.jsonl, points/*/result.json), each recipe's prediction at every measured
count beside the measured efficiency, without running anything.

    python -m benchmarks.replay_scaling DIR [DIR ...] [--predict 8,64,512]

The links are the ones the run's scale.json names under "within a node" (the calibrated bus bandwidth and latency);
between nodes, perflab's stated defaults.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from perflab.results import Result
from perflab.sweep.points import read_points
from perflab.sweep.predict import Interconnect, Link, PredictConfig, predict_rows
from perflab.sweep.scale import _group_key, scaling_rows


def network_of(scale: dict) -> Interconnect:
    """The links the run assumed: the within-node figures parsed from its assumptions."""
    within = scale["assumptions"]["within a node"]
    busbw = float(re.search(r"([\d.]+) GB/s", within).group(1))
    latency = re.search(r"latency measured ([\d.]+) µs", within)
    settings = PredictConfig(predict="2")
    return Interconnect(intra=Link(busbw, float(latency.group(1)) * 1e-6 if latency else 10e-6, within),
                        inter=Link(settings.inter_node_gbits / 8, settings.inter_node_latency_us * 1e-6, "stated"),
                        gpus_per_node=settings.gpus_per_node)


def replay(folder: Path, counts: list[int]) -> None:
    scale = json.loads((folder / "scale.json").read_text())
    rows = scaling_rows(read_points(folder / "sweep.jsonl"))
    singles = {_group_key(row): Result.load(folder / row.dir) for row in rows
               if row.ok and row.config.nproc == 1 and row.dir}
    for prediction in predict_rows(rows, singles, network_of(scale), counts, _group_key):
        measured = prediction.measured_efficiency_pct
        error = "" if measured is None else f"{prediction.efficiency_pct - measured:+.1f} points"
        print(f"{folder.name:32s} {prediction.parallel:5s} {prediction.gpus:4d} GPUs  measured "
              f"{'' if measured is None else f'{measured:.1f}%':7s} predicted {prediction.efficiency_pct:5.1f}% "
              f"{error:13s} tax {prediction.overlap_tax_ms:6.2f} ms  {prediction.overlap_tax}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--predict", default="8,64,512", help="counts past the measured ones (default 8,64,512)")
    args = parser.parse_args()
    counts = [int(part) for part in args.predict.split(",") if part.strip()]
    for folder in args.folders:
        replay(folder, counts)


if __name__ == "__main__":
    main()

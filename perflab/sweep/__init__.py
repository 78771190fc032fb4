"""Sweeps: many configurations of one workload, one point at a time, resumable.

    point.py   the data model: a finished point (a line of sweep.jsonl), a scale row, sweep.json
    points.py  `perflab sweep`: the grid, one result per point, sweep.jsonl, auto batch search
    scale.py   `perflab scale --nproc 1,2,...`: a sweep over rank counts and its scaling efficiency
"""

from perflab.sweep.point import ScaleRow, SweepMeta, SweepPoint, measured_figures  # noqa: F401
from perflab.sweep.points import (  # noqa: F401
    SWEEP_JSON, SWEEP_JSONL, SWEEP_CSV, POINTS_DIR, DONE_STATUSES, CSV_METRICS, SweepObserver, SweepSummary,
    free_memory, point_key, point_params, point_label, read_rows, read_points, trim_partial_line,
    best_points, Sweep, swept_axes, run_sweep, run_auto_batch
)

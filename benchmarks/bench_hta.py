"""HolisticTraceAnalysis as a cross-check: perflab's GPU busy/idle split and top kernels against HTA's temporal
breakdown and kernel breakdown, on the recorded H100 traces (tests/fixtures/traces/gpu/, .../patterns/).

    python -m benchmarks.bench_hta --out DIR          (needs HTA: pip install 'perflab[hta]')

No GPU is needed: it reads recorded traces. Without HTA the area writes one row saying so and exits 0.

Like for like: both sides count the same events over the same window.
- Window: perflab's GPU window (the ProfilerStep ranges extended to the last GPU activity; from the first kernel when
  the GPU was still busy with work launched before the capture). HTA's own percentages divide by
  the span from its first GPU event to its last, which leaves out the idle before the first kernel; here HTA's busy
  microseconds are divided by perflab's window instead (`hta_own_span_pct` keeps HTA's own figure).
- Steps: HTA drops the last ProfilerStep's kernels by default; it is loaded with include_last_profiler_step=True,
  so it sees every profiled step, as perflab does.
- Time stamps: HTA rounds every event inward to whole microseconds (start up, end down), which takes up to 2 µs off
  each kernel; the comparison runs with HTA_DISABLE_NS_ROUNDING=1, and `hta_rounded_busy_pct` is HTA's default.
- Busy: HTA's compute + non-compute time is the union of kernels, memcpys and memsets; perflab's `busy_pct` counts
  kernels only and `copy_only_pct` the copies outside them, and memsets are in neither: `memset_only_pct` is them.
- Launches: HTA keeps only the GPU events whose launch call is in the trace; work launched before the capture and
  still running in it is perflab's, not HTA's: `precapture_only_pct`.

DIR/rows.json            the suite's rows; DIR/hta_compare.json: one record per trace with every figure.
The last lines printed are the table: trace | perflab busy% | HTA busy% | diff | top-3 kernels agree | top share.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from benchmarks.common import Rows, parse_args
import numpy as np

from perflab.diagnose import diagnose
from perflab.diagnose.intervals import Intervals, intervals_of
from perflab.diagnose.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIRS = (ROOT / "tests" / "fixtures" / "traces" / "gpu", ROOT / "tests" / "fixtures" / "traces" / "patterns")
TOP_KERNELS = 3
RANK_FILE = "rank-0.json"


def fixture_traces() -> list[Path]:
    """The recorded GPU traces, gpu/ then patterns/, by name."""
    return [p for d in FIXTURE_DIRS for p in sorted(d.glob("*.json.gz"))]


def trace_name(trace: Path) -> str:
    return trace.name.removesuffix(".gz").removesuffix(".json")


def prepare_trace_dir(trace: Path, dest: Path, rank: int = 0) -> Path:
    """Write `dest/rank-<rank>.json`: the trace unzipped, with `distributedInfo.rank` set (HTA maps files to ranks by
    a `"rank": N` it finds in the file; a file without one is rank 0 with a warning). The trace is only read."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt", encoding="utf-8") as stream:
        data = json.load(stream)
    info = data.get("distributedInfo")
    data["distributedInfo"] = {**(info if isinstance(info, dict) else {}), "rank": rank}
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.json*"):  # one file per rank: a leftover would be read as another rank
        stale.unlink()
    out = dest / f"rank-{rank}.json"
    with open(out, "w", encoding="utf-8") as stream:
        json.dump(data, stream)
    return out


def perflab_figures(trace: Path) -> dict[str, Any]:
    """perflab's figures on one trace: the diagnosis profile's window, busy/copy/idle shares and top kernels, plus
    the memset-only share (perflab's busy/idle split leaves memsets out)."""
    parsed = load_trace(trace)
    profile = diagnose(parsed).profile
    gpu = profile.gpu
    start, end = profile.gpu_start_us, profile.end_us  # the window of perflab's GPU busy/idle split
    window_us = end - start
    kernels_or_copies = Intervals.of(intervals_of(parsed.kernels), intervals_of(parsed.memcpys)).clip(start, end)
    memset_busy = intervals_of(parsed.memsets).clip(start, end)
    any_busy = Intervals.of(kernels_or_copies, memset_busy)
    memset_only_us = any_busy.total - kernels_or_copies.total
    # GPU work launched before the capture: in the trace, but its launch call is not, so HTA (which keeps the GPU
    # events whose correlation id matches a CPU event of the profiled steps) leaves it out
    launches = parsed.runtime.correlation
    captured = [intervals_of(table, np.isin(table.correlation, launches))
                for table in (parsed.kernels, parsed.memcpys, parsed.memsets)]
    precapture_only_us = any_busy.total - Intervals.of(*captured).clip(start, end).total
    return {
        "start_us": start, "end_us": end, "window_us": window_us, "steps": profile.steps,
        "busy_pct": gpu.busy_pct, "copy_only_pct": gpu.copy_only_pct, "idle_pct": gpu.idle_pct,
        "memset_only_pct": 100 * memset_only_us / window_us,
        "precapture_only_pct": 100 * precapture_only_us / window_us,
        "top_kernels": [(row.name, row.share_pct) for row in gpu.kernel_table[:TOP_KERNELS]],
    }


@contextmanager
def _environment(name: str, value: Optional[str]) -> Iterator[None]:
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def hta_figures(trace_dir: Path, exact_times: bool = True) -> dict[str, Any]:
    """HTA's temporal breakdown and computation-kernel breakdown of the one-rank trace in `trace_dir`; times on the
    trace's clock. `exact_times=False` keeps HTA's default rounding of events to whole microseconds."""
    from hta.trace_analysis import TraceAnalysis  # optional dependency (perflab[hta]); the area runs without it

    with _environment("HTA_DISABLE_NS_ROUNDING", "1" if exact_times else None):
        analysis = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
        temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        _, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=TOP_KERNELS,
                                                       include_memory_kernels=False)
    frame = analysis.t.get_trace(0)
    gpu_events = frame[frame["stream"].ne(-1)]
    span_start = float(gpu_events["ts"].min()) + analysis.t.min_ts
    span_end = float((gpu_events["ts"] + gpu_events["dur"]).max()) + analysis.t.min_ts
    compute = kernels[kernels["kernel_type"] == "COMPUTATION"].sort_values("sum (us)", ascending=False)
    compute_total = float(compute["sum (us)"].sum()) or 1e-9
    named = compute[compute["name"] != "others"]
    return {
        "span_start_us": span_start, "span_end_us": span_end,
        "idle_us": float(temporal["idle_time(us)"]), "compute_us": float(temporal["compute_time(us)"]),
        "non_compute_us": float(temporal["non_compute_time(us)"]), "span_us": float(temporal["kernel_time(us)"]),
        "top_kernels": [(row["name"], 100 * float(row["sum (us)"]) / compute_total)
                        for _, row in named.head(TOP_KERNELS).iterrows()],
    }


def _rounded_busy_us(trace_dir: Path) -> Optional[float]:
    """HTA's busy time with its default rounding of events to whole µs; None where the rounded events trip HTA's own
    assertion that non-compute time is not negative."""
    try:
        figures = hta_figures(trace_dir, exact_times=False)
    except AssertionError:
        return None
    return figures["compute_us"] + figures["non_compute_us"]


def top_kernels_agree(perflab_top: list, hta_top: list) -> str:
    """'yes' when both name the same top kernels in the same order, 'same set' in another order, else 'no'."""
    ours, theirs = [name for name, _ in perflab_top], [name for name, _ in hta_top]
    if ours == theirs:
        return "yes"
    return "same set" if sorted(ours) == sorted(theirs) else "no"


def compare(trace: Path, work: Path) -> dict[str, Any]:
    """One trace's record: perflab's and HTA's figures over perflab's window, and their differences."""
    ours = perflab_figures(trace)
    trace_dir = work / trace_name(trace)
    prepare_trace_dir(trace, trace_dir)
    theirs = hta_figures(trace_dir)
    rounded = _rounded_busy_us(trace_dir)
    window_us = ours["window_us"]
    hta_busy_us = theirs["compute_us"] + theirs["non_compute_us"]
    perflab_busy_pct = 100 - ours["idle_pct"]  # kernels or copies
    hta_busy_pct = 100 * hta_busy_us / window_us
    return {
        "trace": trace_name(trace), "perflab": ours, "hta": theirs,
        "perflab_kernel_busy_pct": ours["busy_pct"], "perflab_busy_pct": perflab_busy_pct,
        "hta_compute_pct": 100 * theirs["compute_us"] / window_us, "hta_busy_pct": hta_busy_pct,
        "diff_points": hta_busy_pct - perflab_busy_pct,
        # what is left once HTA's memsets and perflab's pre-capture work are accounted for
        "unexplained_points": (hta_busy_pct - perflab_busy_pct - ours["memset_only_pct"]
                               + ours["precapture_only_pct"]),
        "hta_own_span_pct": 100 * hta_busy_us / max(theirs["span_us"], 1e-9),
        "hta_rounded_busy_pct": None if rounded is None else 100 * rounded / window_us,
        "span_inside_window": bool(theirs["span_start_us"] >= ours["start_us"] - 1
                                   and theirs["span_end_us"] <= ours["end_us"] + 1),
        "edge_idle_pct": 100 * (window_us - theirs["span_us"]) / window_us,
        "top_kernels_agree": top_kernels_agree(ours["top_kernels"], theirs["top_kernels"]),
    }


def add_rows(rows: Rows, record: dict[str, Any]) -> None:
    name = record["trace"]
    note = f"top-3 kernels {record['top_kernels_agree']}"
    for metric in ("perflab_kernel_busy_pct", "perflab_busy_pct", "hta_compute_pct", "hta_busy_pct", "diff_points",
                   "hta_own_span_pct", "hta_rounded_busy_pct"):
        value = record[metric]
        rows.add(name, metric, None if value is None else round(value, 3), "points" if metric == "diff_points" else "%",
                 note=note if metric == "diff_points" else "")
    for metric in ("memset_only_pct", "precapture_only_pct", "copy_only_pct"):
        rows.add(name, metric, round(record["perflab"][metric], 3), "%")
    rows.add(name, "unexplained_points", round(record["unexplained_points"], 3), "points")
    for side in ("perflab", "hta"):
        top = record[side]["top_kernels"]
        if top:
            rows.add(name, f"{side}_top_kernel_share", round(top[0][1], 2), "%", note=top[0][0][:120])


def print_table(records: list[dict[str, Any]]) -> None:
    print("\ntrace | perflab busy% (kernels / +copies) | HTA busy% (compute / +non-compute) | diff (points) | "
          "memsets / pre-capture / rest (points) | top-3 kernels agree | top kernel share perflab / HTA")
    for r in records:
        ours, theirs = r["perflab"]["top_kernels"], r["hta"]["top_kernels"]
        share = (f"{ours[0][1]:.1f}% / {theirs[0][1]:.1f}%" if ours and theirs else "-")
        print(f"{r['trace']} | {r['perflab_kernel_busy_pct']:.1f} / {r['perflab_busy_pct']:.1f} | "
              f"{r['hta_compute_pct']:.1f} / {r['hta_busy_pct']:.1f} | {r['diff_points']:+.2f} | "
              f"{r['perflab']['memset_only_pct']:+.2f} / {-r['perflab']['precapture_only_pct']:+.2f} / "
              f"{r['unexplained_points']:+.2f} | "
              f"{r['top_kernels_agree']} | {share}")


def hta_version() -> Optional[str]:
    try:
        from importlib.metadata import version
        return version("HolisticTraceAnalysis")
    except Exception:  # not installed
        return None


def run_area(out: Path) -> list[dict]:
    rows = Rows("hta", out)
    version = hta_version()
    if version is None:
        rows.add("(area)", "status", None, note="skipped: HolisticTraceAnalysis is not installed (perflab[hta])")
        return rows.rows
    print(f"[hta] HolisticTraceAnalysis {version}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="perflab-hta-"))
    records = []
    began = time.time()
    try:
        for trace in fixture_traces():
            try:
                record = compare(trace, work)
            except Exception as err:  # one trace HTA cannot read must not lose the others
                rows.add(trace_name(trace), "diff_points", None, note=f"failed: {type(err).__name__}: {err}"[:200])
                continue
            records.append(record)
            add_rows(rows, record)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "hta_compare.json").write_text(json.dumps({"hta_version": version, "records": records}, indent=1))
    print(f"[hta] {len(records)} traces in {time.time() - began:.0f}s", flush=True)
    print_table(records)
    return rows.rows


def main() -> int:
    args = parse_args()
    run_area(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

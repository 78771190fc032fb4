"""Sweeps: run a grid of configs (or double the batch until it stops paying), one saved point at a time.

Layout of a sweep directory:

    sweep.json                  what was swept, the base config, the best points (rewritten as it goes)
    sweep.jsonl                 one line per finished point, appended and fsynced at once
    sweep.csv                   the same rows as a table (rewritten after each point)
    points/<label>/result.json  each successful point's full result
    *.png                       throughput, latency and memory vs batch

A point is identified by a hash of its resolved config, so `resume` skips exactly the points already
recorded (ok or oom) and a kill at any moment loses at most the point that was running.
"""
from __future__ import annotations

import csv
import gc
import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

import torch

import perflab
from perflab import options
from perflab.config import RunConfig
from perflab.errors import OutOfMemoryFailure, PerflabError, is_out_of_memory
from perflab.oom import OutOfMemory
from perflab.harness.progress import Reporter
from perflab.pipeline import resolve_config
from perflab.results import atomic_file, validate, write_json_atomic
from perflab.results.result import check_schema_version
from perflab.results.rundir import locked_out
from perflab.sweep.point import SweepPoint, measured_figures, value_text
from perflab.workloads import check_spec

SWEEP_JSON = "sweep.json"
SWEEP_JSONL = "sweep.jsonl"
SWEEP_CSV = "sweep.csv"
POINTS_DIR = "points"
DONE_STATUSES = ("ok", "oom", "invalid")  # finished measurements: a resume does not redo them
CSV_METRICS = ["throughput", "throughput_ci_low", "throughput_ci_high", "p50_ms", "p95_ms", "p99_ms",
               "peak_memory_mb", "gpu_util_pct", "mfu_pct", "quality", "elapsed_s", "error"]


def check_same_search(out: Path, recorded: dict, current: dict, what: str) -> None:
    """--resume continues a search only with the options that define it: refuse (one line naming the options that
    differ) a folder whose recorded config differs from `current` (both RunConfig-like dicts)."""
    flags = {declared.name: declared.flag for declared in options.options_of(RunConfig)}
    # an option added since the folder was written counts as recorded at its default
    defaults = json.loads(json.dumps(RunConfig().to_dict(), default=str))
    normal = json.loads(json.dumps(current, default=str))
    recorded = {**{name: defaults[name] for name in normal if name in defaults}, **recorded}
    differing = [f"{flags.get(name, name)} {_shown(recorded.get(name))} -> {_shown(normal.get(name))}"
                 for name in normal if name != "out" and json.dumps(recorded.get(name), sort_keys=True, default=str)
                 != json.dumps(normal.get(name), sort_keys=True, default=str)]
    if differing:
        raise PerflabError(f"--resume: {out} holds {what} with other options ({'; '.join(differing)}); give the "
                           f"same options (or --resume --out {out} alone), or choose another --out")


def _shown(value: object) -> str:
    return "unset" if value is None else json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


class SweepObserver:
    """Progress callbacks; the CLI draws them as a progress bar, the library ignores them."""

    def begin(self, total: Optional[int], already_done: int) -> None:
        pass

    def point_started(self, label: str) -> None:
        pass

    def point_finished(self, row: SweepPoint, reused: bool) -> None:
        pass


# Draws a sweep's figures into its folder from its rows and axes, and returns them by name (report/plots.py's
# sweep_plots and scaling_plots). The caller passes it in: report/ reads the sweep's files, so a driver never
# imports report/ (None: no plots).
DrawPlots = Callable[[list[dict[str, Any]], list[str], Path], dict[str, Path]]

@dataclass
class SweepSummary:
    """What a sweep produced: every row (finished points), the best ones, and the files written."""

    out: Path
    axes: list[str]
    rows: list[SweepPoint]
    best: Optional[SweepPoint]
    best_under_bound: Optional[SweepPoint]
    max_p95_ms: Optional[float]
    plots: dict[str, str] = field(default_factory=dict)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def point_key(cfg: RunConfig) -> str:
    """A stable id of a resolved config (everything but its output directory)."""
    data = cfg.to_dict()
    data.pop("out", None)
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def point_params(cfg: RunConfig, axes: Sequence[str]) -> dict[str, Any]:
    """The swept values of a point, always including the batch size."""
    data = cfg.to_dict()
    names = list(axes) + ([] if "batch_size" in axes else ["batch_size"])
    return {name: data[name] for name in names}


def point_label(cfg: RunConfig, axes: Sequence[str]) -> str:
    short = {"batch_size": "batch", "precision": "", "workers": "workers", "pin_memory": "pin"}
    parts = [f"{short.get(name, name)}{'' if short.get(name) == '' else '='}{value_text(value)}"
             for name, value in point_params(cfg, axes).items()]
    return " ".join(parts)


def _dir_name(label: str, key: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in label.replace(" ", "_").replace("=", "-"))
    return f"{safe}-{key[:6]}"


# the figures a sweep.jsonl or tune.jsonl row may hold (measured_figures, tune/trial.py): each a number or null
ROW_NUMBERS = ("throughput", "throughput_ci_low", "throughput_ci_high", "trials", "p50_ms", "p95_ms", "p99_ms",
               "peak_memory_mb", "gpu_util_pct", "mfu_pct", "world_size", "warmup_s", "compile_s", "timed_s",
               "max_qps", "resolution_pct", "wall_s")


def read_rows(path: Union[str, Path]) -> list[dict[str, Any]]:
    """Rows of a sweep.jsonl (or tune.jsonl) as written; a partial last line (a kill during a write) is ignored; last
    write of a key wins."""
    path = Path(path)
    if path.is_dir():
        path = path / SWEEP_JSONL
    if not path.is_file():
        raise PerflabError(f"no sweep at {path}: give a directory made by `perflab sweep`")
    lines = path.read_text().splitlines()
    rows: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = validate.parse_json(line, path, f" line {number}")
        except json.JSONDecodeError:
            if number == len(lines):
                break  # interrupted while appending: that point was not finished
            raise PerflabError(f"{path} line {number} is not valid JSON; delete that line and resume") from None
        if not isinstance(row, dict) or "key" not in row:
            raise PerflabError(f"{path} line {number} is not a sweep point; delete that line and resume")
        check_schema_version(row, f"{path} line {number}")
        validate.numbers(row, ROW_NUMBERS, f"{path} line {number}")
        validate.number(row, "index", f"{path} line {number}", optional=False, whole=True)
        validate.number_list(row, "throughput_ci95", f"{path} line {number}")
        rows[row["key"]] = row
    return sorted(rows.values(), key=lambda row: row["index"])


def read_points(path: Union[str, Path]) -> list[SweepPoint]:
    """The finished points of a sweep.jsonl, typed (read_rows' rows, from any perflab version)."""
    return [SweepPoint.from_dict(row) for row in read_rows(path)]


def trim_partial_line(path: Path) -> None:
    """Cut a trailing partial line so that appended rows start on a line of their own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as stream:
            stream.truncate(data.rfind(b"\n") + 1)


Point = TypeVar("Point", SweepPoint, dict)


def best_points(rows: Iterable[Point], max_p95_ms: Optional[float] = None) -> tuple[Optional[Point], Optional[Point]]:
    """The fastest point by throughput, and the fastest whose p95 step latency is within the bound.
    Points that failed their quality gate, or diverged (status invalid), are never the best. Rows read as dicts
    (`perflab report` reads sweep.jsonl with read_rows) are judged the same and returned as given."""
    given = list(rows)
    typed = [row if isinstance(row, SweepPoint) else SweepPoint.from_dict(row) for row in given]
    ok = [(point, row) for point, row in zip(typed, given) if point.ok and point.quality != "fail"]
    best = max(ok, key=lambda pair: pair[0].throughput, default=None)
    if max_p95_ms is None:
        return best and best[1], None
    bounded = max(((point, row) for point, row in ok if point.p95_ms <= max_p95_ms),
                  key=lambda pair: pair[0].throughput, default=None)
    return best and best[1], bounded and bounded[1]


class Sweep:
    """A sweep directory being filled: runs points (or reuses recorded ones) and records each at once."""

    def __init__(self, out: Union[str, Path], axes: Sequence[str], resume: bool = False,
                 max_p95_ms: Optional[float] = None, observer: Optional[SweepObserver] = None,
                 command: Optional[list[str]] = None, reporter_factory: Callable[[], Reporter] = Reporter,
                 description: Optional[dict[str, Any]] = None):
        self.out = Path(out)
        self.axes = list(axes)
        self.max_p95_ms = max_p95_ms
        self.observer = observer or SweepObserver()
        self.command = command or []
        self.reporter_factory = reporter_factory
        self.description = description or {}
        self.jsonl = self.out / SWEEP_JSONL
        self._prepare(resume)
        if resume:
            self._check_same_sweep()
        self.rows: dict[str, SweepPoint] = {point.key: point for point in read_points(self.jsonl)} \
            if self.jsonl.exists() else {}
        self.next_index = max((point.index for point in self.rows.values()), default=-1) + 1
        self._write_meta()

    def _prepare(self, resume: bool) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise PerflabError(f"--out {self.out} exists and is not a directory; choose another --out")
        if self.jsonl.exists() and not resume:
            raise PerflabError(f"--out {self.out} already holds a sweep; add --resume to continue it, "
                               "or choose another --out")
        try:
            (self.out / POINTS_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PerflabError(f"cannot write to --out {self.out}: {err.strerror}") from None
        trim_partial_line(self.jsonl)

    def _check_same_sweep(self) -> None:
        """A resumed sweep is the same search: the same kind (grid or auto-batch) and the same value of every option
        that neither sweeps (a resume may add values of a swept option); otherwise its points would mix with
        another's."""
        meta_path = self.out / SWEEP_JSON
        if not self.jsonl.exists() or not meta_path.is_file():
            return
        try:
            recorded = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(recorded, dict):
            return
        old_axes, new_axes = list(recorded.get("axes") or []), self.axes
        swept = set(old_axes) | set(new_axes)

        def search(meta: dict[str, Any]) -> dict[str, Any]:
            fixed = {k: v for k, v in (meta.get("base_config") or {}).items() if k not in swept}
            return {"sweep kind": meta.get("mode"), **fixed}
        check_same_search(self.out, search(recorded), search(self.description), "a sweep")

    @property
    def done(self) -> list[SweepPoint]:
        return sorted(self.rows.values(), key=lambda point: point.index)

    def point(self, config: RunConfig) -> SweepPoint:
        """Run one point, or return its recorded row if it was finished before (ok or oom)."""
        cfg = resolve_config(config, None)
        key = point_key(cfg)
        recorded = self.rows.get(key)
        if recorded is not None and recorded.status in DONE_STATUSES:
            self.observer.point_finished(recorded, reused=True)
            return recorded
        label = point_label(cfg, self.axes)
        self.observer.point_started(label)
        point = self._measure(cfg, key, label)
        self._record(point)
        self.observer.point_finished(point, reused=False)
        return point

    def _measure(self, cfg: RunConfig, key: str, label: str) -> SweepPoint:
        point_dir = self.out / POINTS_DIR / _dir_name(label, key)
        point_dir.mkdir(parents=True, exist_ok=True)
        point = SweepPoint(index=self.next_index, key=key, label=label, params=point_params(cfg, self.axes),
                           config=cfg)
        began = time.perf_counter()
        failure: Optional[tuple[str, str]] = None
        try:
            result = perflab.run(cfg.workload, cfg.replace(out=str(point_dir)), reporter=self.reporter_factory(),
                                 command=self.command)
            if result.status == "interrupted":  # Ctrl-C inside the point's trials: the point is not finished
                raise KeyboardInterrupt
            result.save(point_dir)
        except OutOfMemoryFailure as err:  # the run saved its result.json (status oom) in the point's folder
            failure = ("oom", err.record)
        except PerflabError as err:
            failure = ("error", str(err))
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                shutil.rmtree(point_dir, ignore_errors=True)
                raise
            failure = ("oom", OutOfMemory.from_error(err, None, cfg).to_dict())
        except BaseException:
            shutil.rmtree(point_dir, ignore_errors=True)
            raise
        # Outside the except block, so the traceback (and the tensors its frames hold) can be freed.
        if failure is not None and failure[0] == "oom":
            free_memory()
            record = OutOfMemory.from_dict(failure[1])
            kept = (point_dir / "result.json").is_file()
            point = replace(point, status="oom", error=record.summary(), out_of_memory=record.to_dict(),
                            dir=str(point_dir.relative_to(self.out)) if kept else None)
            if not kept:
                shutil.rmtree(point_dir, ignore_errors=True)
        elif failure is not None:
            shutil.rmtree(point_dir, ignore_errors=True)
            free_memory()
            point = replace(point, status=failure[0], error=failure[1], dir=None)
        else:
            status = "invalid" if result.status == "invalid" else "ok"
            point = replace(point, status=status, error=result.status_reason or None,
                            dir=str(point_dir.relative_to(self.out)), **measured_figures(result))
            del result
            free_memory()
        return replace(point, elapsed_s=time.perf_counter() - began)

    def _record(self, point: SweepPoint) -> None:
        with open(self.jsonl, "a") as stream:
            stream.write(json.dumps(point.to_dict(), allow_nan=True) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        self.rows[point.key] = point
        self.next_index += 1
        self._write_csv()
        self._write_meta()

    def _write_csv(self) -> None:
        params = list(dict.fromkeys(name for point in self.done for name in point.params))
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["index", "label", "status"] + params + CSV_METRICS)
        for point in self.done:
            figures = [getattr(point, name) for name in CSV_METRICS]
            writer.writerow([point.index, point.label, point.status]
                            + [value_text(point.params.get(name)) for name in params]
                            + ["" if figure is None else figure for figure in figures])
        with atomic_file(self.out / SWEEP_CSV) as temp:
            temp.write_text(buffer.getvalue())

    def _write_meta(self, plots: Optional[dict[str, str]] = None) -> None:
        best, bounded = best_points(self.done, self.max_p95_ms)
        meta = {"kind": "sweep", "axes": self.axes, "command": self.command, "max_p95_ms": self.max_p95_ms,
                "points_done": len(self.rows), "best": best and best.key,
                "best_under_bound": bounded and bounded.key, "plots": plots or {}, **self.description}
        write_json_atomic(self.out / SWEEP_JSON, meta)

    def finish(self, plots: Optional[DrawPlots] = None) -> SweepSummary:
        """Name the best points and draw the plots (when given a drawer); safe to call on a partial sweep."""
        rows = self.done
        files: dict[str, str] = {}
        if plots and any(point.ok for point in rows):
            drawn = plots([point.to_dict() for point in rows], self.axes, self.out)
            files = {name: str(path.relative_to(self.out)) for name, path in drawn.items()}
        self._write_meta(files)
        best, bounded = best_points(rows, self.max_p95_ms)
        return SweepSummary(self.out, self.axes, rows, best, bounded, self.max_p95_ms, files)


def _check_workloads(configs: Sequence[RunConfig]) -> None:
    """An unknown workload name is a mistake in the command, not a failed point: refuse it before any point runs."""
    for spec in dict.fromkeys(cfg.workload for cfg in configs):
        check_spec(spec)


def swept_axes(configs: Sequence[RunConfig]) -> list[str]:
    """The config fields whose values differ between configs (in RunConfig field order)."""
    dicts = [cfg.to_dict() for cfg in configs]
    if not dicts:
        return []
    return [name for name in dicts[0] if name != "out"
            and len({json.dumps(d[name], sort_keys=True, default=str) for d in dicts}) > 1]


def _describe(configs: Sequence[RunConfig], kind: str, **extra: Any) -> dict[str, Any]:
    base = resolve_config(configs[0], None).to_dict()
    return {"mode": kind, "base_config": base, "points_planned": len(configs) if kind == "grid" else None, **extra}


def run_sweep(configs: Sequence[RunConfig], out: Union[str, Path], axes: Optional[Sequence[str]] = None,
              resume: bool = False, max_p95_ms: Optional[float] = None, observer: Optional[SweepObserver] = None,
              command: Optional[list[str]] = None, plots: Optional[DrawPlots] = None,
              reporter_factory: Callable[[], Reporter] = Reporter) -> SweepSummary:
    """Run every config (skipping those already recorded in `out` when resuming); returns the summary."""
    if not configs:
        raise PerflabError("the sweep has no points: give at least one value per option")
    _check_workloads(configs)
    axes = list(axes) if axes is not None else swept_axes(configs)
    with locked_out(Path(out)) as folder:  # one writer per sweep folder: two sweeps never mix their points
        sweep = Sweep(folder, axes, resume, max_p95_ms, observer, command, reporter_factory,
                      _describe(configs, "grid"))
        sweep.observer.begin(len(configs), sum(1 for cfg in configs
                                               if point_key(resolve_config(cfg, None)) in sweep.rows))
        for cfg in configs:
            sweep.point(cfg)
        return sweep.finish(plots)


def run_auto_batch(configs: Sequence[RunConfig], out: Union[str, Path], growth_pct: float = 5.0,
                   max_batch: int = 4096, axes: Optional[Sequence[str]] = None, resume: bool = False,
                   max_p95_ms: Optional[float] = None, observer: Optional[SweepObserver] = None,
                   command: Optional[list[str]] = None, plots: Optional[DrawPlots] = None,
                   reporter_factory: Callable[[], Reporter] = Reporter) -> SweepSummary:
    """For each config, double the batch from its own (or the workload default) until a point runs out of
    memory, throughput grows by less than `growth_pct` percent, or the batch would pass `max_batch`."""
    if not configs:
        raise PerflabError("the sweep has no points: give at least one value per option")
    if growth_pct < 0:
        raise PerflabError(f"--growth-pct must be 0 or more, got {growth_pct}")
    _check_workloads(configs)
    axes = [name for name in (axes if axes is not None else swept_axes(configs)) if name != "batch_size"]
    axes = ["batch_size"] + axes
    with locked_out(Path(out)) as folder:
        sweep = Sweep(folder, axes, resume, max_p95_ms, observer, command, reporter_factory,
                      _describe(configs, "auto-batch", growth_pct=growth_pct, max_batch=max_batch))
        sweep.observer.begin(None, 0)
        for base in configs:
            batch = resolve_config(base, None).batch_size
            previous: Optional[float] = None
            while batch <= max_batch:
                point = sweep.point(base.replace(batch_size=batch))
                if not point.ok:
                    break
                if previous is not None and point.throughput < previous * (1 + growth_pct / 100):
                    break
                previous = point.throughput
                batch *= 2
        return sweep.finish(plots)

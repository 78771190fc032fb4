"""Parse a Chrome trace from torch.profiler once, keeping only what the rules read, as numpy columns.

The JSON is decoded with an `object_hook` that turns every trace event into a row of the table it
belongs to and drops the event dict right away, so a trace of tens of MB never exists twice in memory:
what remains is a few numpy arrays (kernels, copies, runtime calls, CPU ops, annotations, and the Python
frames of a trace recorded `with_stack`) and the shapes of the matmul/conv ops the roofline needs. A single-process trace without rank information is the
normal case; `distributedInfo`, when present, is kept as metadata.
"""
from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from perflab.errors import PerflabError
from perflab.results.validate import is_number, kind_of

# Ops whose input shapes give FLOPs and bytes (the roofline); their shapes are kept, others' are not.
SHAPED_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution",
              "aten::_convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution")
GPU_CATEGORIES = {"kernel": "kernels", "gpu_memcpy": "memcpys", "gpu_memset": "memsets"}
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
RANGE_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)#")  # ranges the profiler itself opens
COLLECTIVE_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size")
# what each field the reader uses must hold, as (check, "what was expected"); absent fields are fine
EVENT_FIELDS = {"name": (lambda v: isinstance(v, str), "a string"), "cat": (lambda v: isinstance(v, str), "a string"),
                "ts": (is_number, "a number"), "dur": (is_number, "a number"),
                "args": (lambda v: isinstance(v, dict), "an object")}
NUMBER_ARGS = ("stream", "bytes", "Total Allocated", "Total Reserved")
NOT_A_PROFILER_TRACE = "the file is not a trace torch.profiler wrote: profile the run again"


@dataclass
class EventTable:
    """Parallel columns of one kind of event; `names[name_id[i]]` is event i's name. Times in µs."""

    names: list[str]
    name_id: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    ext_id: np.ndarray  # the profiler's External id (links GPU work to the CPU op); -1 when absent
    correlation: np.ndarray  # links a runtime call to the kernel/copy it launched; -1 when absent
    tid: np.ndarray
    extra: np.ndarray  # per-kind number: bytes for copies, stream for kernels, Sequence number for CPU ops (-1
    # when absent: it links a backward op to the forward op that made it), 0 otherwise

    @property
    def end_us(self) -> np.ndarray:
        return self.start_us + self.dur_us

    def __len__(self) -> int:
        return len(self.start_us)

    def name(self, index: int) -> str:
        return self.names[int(self.name_id[index])]

    def ids_matching(self, predicate) -> np.ndarray:
        """Name ids whose name satisfies `predicate(name)`."""
        return np.array([i for i, name in enumerate(self.names) if predicate(name)], dtype=np.int64)

    def mask(self, predicate) -> np.ndarray:
        """Boolean mask of events whose name satisfies `predicate(name)` (evaluated once per distinct name)."""
        return np.isin(self.name_id, self.ids_matching(predicate))


@dataclass
class OpShapes:
    """Input dims, dtypes and concrete scalar arguments of one shaped op call (see SHAPED_OPS)."""

    name: str
    dims: list
    types: list
    concrete: list
    dur_us: float


@dataclass
class ParsedTrace:
    path: str
    kernels: EventTable
    memcpys: EventTable
    memsets: EventTable
    runtime: EventTable
    cpu_ops: EventTable
    annotations: EventTable  # record_function ranges on the host: ProfilerStep#N, perflab phases, user marks
    python: EventTable  # python_function frames ("file.py(line): function"); empty unless recorded with_stack
    shapes: dict[int, OpShapes]  # External id -> shapes of SHAPED_OPS calls
    devices: list[dict[str, Any]]  # deviceProperties (name, totalGlobalMem, ...)
    memory_peaks: dict[str, float]  # "allocated_mb"/"reserved_mb" from [memory] events on the GPU, if recorded
    distributed: Optional[dict[str, Any]] = None
    # External id -> (Input Dims, Input type) of every CPU op that recorded shapes: the operator view's FLOPs/bytes
    inputs: dict[int, tuple[list, list]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # correlation id -> what the profiler recorded of a collective on its kernel (COLLECTIVE_ARGS: its name,
    # element counts in and out, dtype, group size): the message sizes of the communication analysis
    collectives: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) > 0 or len(self.memcpys) > 0

    @property
    def gpu_name(self) -> Optional[str]:
        return self.devices[0].get("name") if self.devices else None

    @property
    def gpu_total_mb(self) -> Optional[float]:
        total = self.devices[0].get("totalGlobalMem") if self.devices else None
        return total / 2**20 if total else None


class _Collector:
    """Rows of one EventTable while parsing: plain lists, turned into arrays once at the end."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.rows: list[tuple] = []

    def add(self, name: str, start: float, dur: float, ext: int, corr: int, tid: int, extra: float) -> None:
        name_id = self.names.setdefault(name, len(self.names))
        self.rows.append((name_id, start, dur, ext, corr, tid, extra))

    def table(self) -> EventTable:
        rows = np.array(self.rows, dtype=np.float64).reshape(-1, 7)
        self.rows = []
        order = np.argsort(rows[:, 1], kind="stable")
        rows = rows[order]
        return EventTable(names=list(self.names), name_id=rows[:, 0].astype(np.int64), start_us=rows[:, 1],
                          dur_us=rows[:, 2], ext_id=rows[:, 3].astype(np.int64),
                          correlation=rows[:, 4].astype(np.int64), tid=rows[:, 5].astype(np.int64),
                          extra=rows[:, 6])


class _TraceReader:
    """The json object_hook: each event becomes a row (or nothing) and is not kept as a dict."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tables = {kind: _Collector() for kind in
                       ("kernels", "memcpys", "memsets", "runtime", "cpu_ops", "annotations", "python")}
        self.shapes: dict[int, OpShapes] = {}
        self.collectives: dict[int, dict[str, Any]] = {}
        self.inputs: dict[int, tuple[list, list]] = {}
        self.peak_allocated = 0.0
        self.peak_reserved = 0.0
        self.events = 0

    def hook(self, obj: dict) -> Any:
        if "ph" not in obj:
            return obj  # args, deviceProperties entries, the top-level object
        self.events += 1
        phase = obj["ph"]
        if phase == "X" or phase == "i":
            self._check_fields(obj)
        if phase == "X":
            self._complete(obj)
        elif phase == "i" and obj.get("name") == "[memory]":
            self._memory(obj.get("args") or {})
        return None

    def _check_fields(self, event: dict) -> None:
        """Refuse, naming the event and the field, a value of a type the reader would trip over."""
        fields = [(name, event[name], EVENT_FIELDS[name]) for name in EVENT_FIELDS if event.get(name) is not None]
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        fields += [(f"args.{name}", args[name], (is_number, "a number")) for name in NUMBER_ARGS
                   if args.get(name) is not None]
        for name, value, (fits, expected) in fields:
            if not fits(value):
                raise PerflabError(f"{self.path}: trace event {self.events} has {name} {kind_of(value)}, expected "
                                   f"{expected}; {NOT_A_PROFILER_TRACE}")

    def _complete(self, event: dict) -> None:
        category = event.get("cat", "")
        kind = GPU_CATEGORIES.get(category)
        if kind is None:
            if category in RUNTIME_CATEGORIES:
                kind = "runtime"
            elif category == "cpu_op":
                kind = "cpu_op"
            elif category == "user_annotation":
                kind = "annotations"
            elif category == "python_function":
                kind = "python"
            else:
                return
        args = event.get("args") or {}
        name = event.get("name", "")
        if name.startswith(RANGE_PREFIXES):  # cpu_ops in older torch versions, user_annotations in newer
            kind = "annotations"
        ext = _int(args.get("External id"))
        corr = _int(args.get("correlation"))
        tid = _int(event.get("tid"))
        start, dur = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        if kind == "kernels":
            extra = float(args.get("stream", 0) or 0)
            if "In msg nelems" in args and corr >= 0:
                self.collectives[corr] = {key: args.get(key) for key in COLLECTIVE_ARGS}
        elif kind == "memcpys":
            extra = float(args.get("bytes", 0) or 0)
        elif kind == "cpu_op":
            extra = float(_int(args.get("Sequence number")))
        else:
            extra = 0.0
        if kind == "cpu_op":
            kind = "cpu_ops"
            if "Input Dims" in args and ext >= 0:
                self.inputs[ext] = (args["Input Dims"], args.get("Input type", []))
            if name in SHAPED_OPS and "Input Dims" in args and ext >= 0:
                self.shapes[ext] = OpShapes(name, args["Input Dims"], args.get("Input type", []),
                                            args.get("Concrete Inputs", []), dur)
        self.tables[kind].add(name, start, dur, ext, corr, tid, extra)

    def _memory(self, args: dict) -> None:
        if args.get("Device Type", 0) == 0:  # host allocations
            return
        self.peak_allocated = max(self.peak_allocated, float(args.get("Total Allocated", 0) or 0))
        self.peak_reserved = max(self.peak_reserved, float(args.get("Total Reserved", 0) or 0))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _check_event_list(path: Path, events: Any, parsed: int) -> None:
    """traceEvents is a non-empty list of event objects (each parsed event is None by now, see _TraceReader.hook)."""
    if not isinstance(events, list):
        raise PerflabError(f"{path}: traceEvents is {kind_of(events)}, expected a list of trace events; "
                           f"{NOT_A_PROFILER_TRACE}")
    stray = next(((index, item) for index, item in enumerate(events) if item is not None), None)
    if stray is not None:
        index, item = stray
        what = "an object with no ph (event phase)" if isinstance(item, dict) else kind_of(item)
        raise PerflabError(f"{path}: traceEvents[{index}] is {what}, expected a trace event; {NOT_A_PROFILER_TRACE}")
    if parsed == 0:
        raise PerflabError(f"{path} holds no trace events: there is nothing to diagnose; profile the run again")


def _open(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "rt", encoding="utf-8")


def load_trace(path: Union[str, Path]) -> ParsedTrace:
    """Parse a torch.profiler Chrome trace (.json or .json.gz); PerflabError if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise PerflabError(f"no trace at {path}: give a run directory with trace.json (from `perflab profile`) "
                           "or a Chrome trace file")
    reader = _TraceReader(path)
    try:
        with _open(path) as stream:
            top = json.load(stream, object_hook=reader.hook)
    except json.JSONDecodeError as err:
        raise PerflabError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); the trace is corrupt or "
                           "was cut short: profile the run again") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise PerflabError(f"cannot read trace {path}: {err}; the file is corrupt or not a (gzipped) "
                           "Chrome trace: profile the run again") from None
    if not isinstance(top, dict) or "traceEvents" not in top:
        raise PerflabError(f"{path} is not a Chrome trace (no traceEvents); give the trace.json that "
                           "torch.profiler or `perflab profile` wrote")
    _check_event_list(path, top["traceEvents"], reader.events)
    tables = {kind: collector.table() for kind, collector in reader.tables.items()}
    devices = [d for d in top.get("deviceProperties") or [] if isinstance(d, dict)]
    peaks = {}
    if reader.peak_allocated or reader.peak_reserved:
        peaks = {"allocated_mb": reader.peak_allocated / 2**20, "reserved_mb": reader.peak_reserved / 2**20}
    metadata = {key: top[key] for key in ("schemaVersion", "record_shapes", "displayTimeUnit") if key in top}
    metadata["events"] = reader.events
    return ParsedTrace(path=str(path), shapes=reader.shapes, inputs=reader.inputs, devices=devices, memory_peaks=peaks,
                       distributed=top.get("distributedInfo"), metadata=metadata, collectives=reader.collectives,
                       **tables)


def step_window(trace: ParsedTrace) -> tuple[float, float, int]:
    """(start, end, steps) of the ProfilerStep# ranges, or of all host events when there are none."""
    ann = trace.annotations
    steps = ann.mask(lambda n: n.startswith("ProfilerStep#"))
    if steps.any():
        start, end = float(ann.start_us[steps].min()), float(ann.end_us[steps].max())
        return start, end, int(steps.sum())
    tables = [t for t in (trace.cpu_ops, trace.annotations, trace.runtime, trace.kernels) if len(t)]
    if not tables:
        return 0.0, 0.0, 0
    return (float(min(t.start_us.min() for t in tables)), float(max(t.end_us.max() for t in tables)), 1)

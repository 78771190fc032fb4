"""Result: the data model of one run, its versioned JSON schema, and atomic save/load."""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from perflab.errors import PerflabError

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
REQUIRED_KEYS = ("schema_version", "config", "environment", "trials", "metrics")


@dataclass
class Trial:
    """One timed trial: wall-clock throughput plus per-step latencies and phase times."""

    wall_s: float
    steps: int
    samples: int
    throughput_samples_per_s: float
    step_ms: list[float]
    phase_ms: dict[str, float]  # mean per step


@dataclass(frozen=True)
class PeakMemory:
    """One peak-memory figure and what it measures (GPU allocations or the whole host process)."""

    mb: Optional[float]
    on_gpu: bool
    label: str  # e.g. "GPU peak allocated": names the figure in tables, notes and plot titles


GPU_PEAK_LABEL = "GPU peak allocated"
HOST_PEAK_LABEL = "host peak RSS (whole process)"


def peak_memory(metrics: dict[str, Any]) -> PeakMemory:
    """Peak memory from a result's metrics (or a comparison's copy of them): GPU if measured, else host RSS."""
    memory = metrics.get("memory") or {}
    if "peak_allocated_mb" in memory:
        return PeakMemory(memory["peak_allocated_mb"], True, GPU_PEAK_LABEL)
    return PeakMemory(memory.get("host_peak_rss_mb"), False, HOST_PEAK_LABEL)


@dataclass
class Result:
    """Everything a run measured. `metrics` holds aggregates over trials (see README: result.json)."""

    config: dict[str, Any]
    environment: dict[str, Any]
    workload: dict[str, Any]
    trials: list[Trial]
    metrics: dict[str, Any]
    timing: dict[str, Any] = field(default_factory=dict)
    levers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    created_utc: str = ""
    quality: Optional[dict[str, Any]] = None
    diagnosis: Optional[dict[str, Any]] = None
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> file in the run dir (trace, ...)
    schema_version: int = SCHEMA_VERSION
    perflab_version: str = ""
    status: str = "complete"  # complete | interrupted (Ctrl-C; finished trials kept) | invalid (NaN/inf) | oom
    status_reason: str = ""
    out_of_memory: Optional[dict[str, Any]] = None  # status oom: perflab.oom.OutOfMemory's figures
    world_size: int = 1  # ranks that measured together (perflab run --nproc); figures are over all of them
    path: Optional[str] = field(default=None, compare=False)

    @property
    def throughput(self) -> float:
        """Median samples/s over trials."""
        return self.metrics["throughput_samples_per_s"]["median"]

    @property
    def peak_memory(self) -> "PeakMemory":
        """The run's peak memory: GPU peak allocated when on CUDA, else the host process's peak RSS."""
        return peak_memory(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "result") -> "Result":
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise PerflabError(f"{source} is not a perflab result: missing {', '.join(missing)}")
        if data["schema_version"] > SCHEMA_VERSION:
            raise PerflabError(f"{source} has schema version {data['schema_version']}, newer than this perflab "
                               f"understands ({SCHEMA_VERSION}); upgrade perflab")
        known = set(cls.__dataclass_fields__) - {"path", "trials"}
        fields = {key: value for key, value in data.items() if key in known}
        try:
            trials = [Trial(**trial) for trial in data["trials"]]
        except TypeError as err:
            raise PerflabError(f"{source} has malformed trials ({err}); re-run to regenerate it") from None
        return cls(trials=trials, **fields)

    def save(self, directory: Union[str, Path]) -> Path:
        """Write `result.json` into `directory` (created if missing) atomically; returns its path."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / RESULT_FILE
        write_json_atomic(path, self.to_dict())
        self.path = str(path)
        return path

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Result":
        """Load a result from a run directory or a result.json file."""
        path = resolve_result_path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise PerflabError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); "
                               "the run may have been interrupted: re-run it") from None
        if not isinstance(data, dict):
            raise PerflabError(f"{path} is not a perflab result (expected a JSON object)")
        result = cls.from_dict(data, source=str(path))
        result.path = str(path)
        return result


def resolve_result_path(path: Union[str, Path]) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    if not path.is_file():
        raise PerflabError(f"no result at {path}: give a run directory (runs/<id>/) or its result.json")
    return path


@contextmanager
def atomic_file(path: Union[str, Path]) -> Iterator[Path]:
    """Yield a temp path beside `path`; when the body succeeds it replaces `path`, otherwise it is removed.

    A reader (or a kill mid-write) never sees a half-written file."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    # mkstemp creates 0600; give the file the mode any other output gets (0666 less the umask)
    os.chmod(temp, 0o666 & ~_umask())
    try:
        yield Path(temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_json_atomic(path: Union[str, Path], data: Any) -> None:
    """Write JSON to a temp file in the same directory, fsync, then rename over `path`."""
    with atomic_file(path) as temp, open(temp, "w") as stream:
        json.dump(data, stream, indent=2, allow_nan=True)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())

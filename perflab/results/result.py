"""Result: the data model of one run, its versioned JSON schema, and atomic save/load."""
from __future__ import annotations

import copy
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from perflab.config import RunConfig, saved_config
from perflab.errors import PerflabError
from perflab.results import validate
from perflab.results.metrics import Metrics, PeakMemory, migrate_v1
from perflab.results.quality import QualityVerdict

SCHEMA_VERSION = 2  # 2: metrics is a typed tree (perflab/metrics.py); 1 is read through metrics.migrate_v1
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


@dataclass
class Result:
    """Everything a run measured. `metrics` holds aggregates over trials (perflab/metrics.py; README: result.json)."""

    config: RunConfig  # a ScriptConfig for a script run, a ServeRunConfig for serve (perflab/config.py)
    environment: dict[str, Any]
    workload: dict[str, Any]
    trials: list[Trial]
    metrics: Metrics
    timing: dict[str, Any] = field(default_factory=dict)
    levers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    created_utc: str = ""
    quality: Optional[QualityVerdict] = None  # the quality gate's verdict (None: the gate did not run)
    diagnosis: Optional[dict[str, Any]] = None
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> file in the run dir (trace, ...)
    schema_version: int = SCHEMA_VERSION
    perflab_version: str = ""
    status: str = "complete"  # complete | interrupted (Ctrl-C) | invalid (NaN/inf, DDP replicas differ) | oom
    status_reason: str = ""
    out_of_memory: Optional[dict[str, Any]] = None  # status oom: perflab.oom.OutOfMemory's figures
    world_size: int = 1  # ranks that measured together (perflab run --nproc); figures are over all of them
    path: Optional[str] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Metrics):  # a JSON-shaped dict, e.g. from a plugin or a test
            self.metrics = Metrics.from_dict(self.metrics or {})
        if not isinstance(self.config, RunConfig):  # a saved config's dict, e.g. from a plugin or a test
            self.config = saved_config(self.config or {})
        self.quality = QualityVerdict.from_dict(self.quality)  # a JSON-shaped dict reads as the typed verdict

    @property
    def throughput(self) -> Optional[float]:
        """Median samples/s over trials."""
        return self.metrics.throughput

    @property
    def peak_memory(self) -> PeakMemory:
        """The run's peak memory: GPU peak allocated when on CUDA, else the host process's peak RSS."""
        return self.metrics.peak_memory

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("path", "metrics", "trials", "config")}
        data = copy.deepcopy(data)
        data["config"] = self.config.to_dict()
        data["trials"] = [asdict(trial) for trial in self.trials]
        data["metrics"] = self.metrics.to_dict()
        data["quality"] = self.quality.to_dict() if self.quality is not None else None
        return {f.name: data[f.name] for f in fields(self) if f.name != "path"}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "result") -> "Result":
        missing = [key for key in REQUIRED_KEYS if key not in data]
        if missing:
            raise PerflabError(f"{source} is not a perflab result: missing {', '.join(missing)}")
        validate.number(data, "schema_version", source, optional=False, whole=True)
        check_schema_version(data, source)
        known = set(cls.__dataclass_fields__) - {"path", "trials", "metrics"}
        found = {key: value for key, value in data.items() if key in known}
        metrics = data["metrics"] or {}
        if not isinstance(metrics, dict):
            raise PerflabError(f"{source} has malformed metrics (not a JSON object); re-run to regenerate it")
        if data["schema_version"] < 2:
            metrics = migrate_v1(metrics)
        found["schema_version"] = SCHEMA_VERSION  # read into this schema; saved again, it is written as such
        _check_figures(data, metrics, source)
        if not isinstance(data["config"], dict):
            raise PerflabError(f"{source} has a malformed config (not a JSON object); re-run to regenerate it")
        found["config"] = saved_config(data["config"])
        try:
            trials = [Trial(**trial) for trial in data["trials"]]
        except TypeError as err:
            raise PerflabError(f"{source} has malformed trials ({err}); re-run to regenerate it") from None
        return cls(trials=trials, metrics=Metrics.from_dict(metrics), **found)

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
        data = read_json_object(path, "a perflab result", "the run may have been interrupted: re-run it")
        result = cls.from_dict(data, source=str(path))
        result.path = str(path)
        return result


TRIAL_NUMBERS = ("wall_s", "steps", "samples", "throughput_samples_per_s")


def _check_figures(data: dict[str, Any], metrics: dict[str, Any], source: str) -> None:
    """The figures compare, rerun and the reports compute with are numbers (a hand-edited string is one line)."""
    trials = validate.objects(data, "trials", source)
    for index, trial in enumerate(trials):
        validate.numbers(trial, TRIAL_NUMBERS, source, prefix=f"trials[{index}].")
        validate.number_list(trial, "step_ms", source, prefix=f"trials[{index}].")
    throughput = validate.section(metrics, "throughput_samples_per_s", source)
    validate.numbers(throughput, ("median", "mean", "min", "max", "stdev", "range_pct", "ci95_low", "ci95_high"),
                     source, prefix="metrics.throughput_samples_per_s.")
    latency = validate.section(metrics, "latency_ms", source)
    validate.numbers(latency, ("p50", "p95", "p99", "mean", "min", "max"), source, prefix="metrics.latency_ms.")


JSON_KINDS = {str: "a string", list: "a list", int: "a number", float: "a number", bool: "true/false",
              type(None): "null"}


def check_schema_version(data: dict[str, Any], source: object) -> None:
    """Refuse a file (result, sweep, tune, compare) whose schema_version is newer than this perflab's."""
    version = data.get("schema_version")
    if validate.is_number(version) and version > SCHEMA_VERSION:
        raise PerflabError(f"{source} was written by a newer perflab: schema version {version}, newer than this "
                           f"perflab understands ({SCHEMA_VERSION}); upgrade perflab")


def read_json_object(path: Union[str, Path], what: str, remedy: str) -> dict[str, Any]:
    """The JSON object saved at `path`; PerflabError (one line: the file, what is wrong, `remedy`) when the file is
    not JSON or holds something else (a string, a list)."""
    try:
        data = validate.parse_json(Path(path).read_text(), path)
    except json.JSONDecodeError as err:
        raise PerflabError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); {remedy}") from None
    except UnicodeDecodeError:
        raise PerflabError(f"{path} is not a text file, so not {what}; {remedy}") from None
    if not isinstance(data, dict):
        found = JSON_KINDS.get(type(data), type(data).__name__)
        raise PerflabError(f"{path} is not {what} (expected a JSON object, found {found}); {remedy}")
    check_schema_version(data, path)
    return data


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
    except BaseException as err:
        Path(temp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # a failed write() names no file: name the one meant
            err.filename = str(path)
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

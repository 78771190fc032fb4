"""Results are data: one run's Result (result.py: trials, schema, atomic save/load), its typed metrics (metrics.py),
its quality gate's verdict (quality.py), and the run folder it is saved in (rundir.py)."""

from perflab.results.metrics import Metrics, PeakMemory  # noqa: F401
from perflab.results.quality import QualityVerdict  # noqa: F401
from perflab.results.result import (  # noqa: F401
    REQUIRED_KEYS, RESULT_FILE, SCHEMA_VERSION, Result, Trial, atomic_file, read_json_object, resolve_result_path,
    write_json_atomic
)

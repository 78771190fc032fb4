"""Results are data: one run's Result (result.py: trials, metrics, schema, atomic save/load) and the run folder
it is saved in (rundir.py)."""

from perflab.results.result import (  # noqa: F401
    SCHEMA_VERSION, RESULT_FILE, REQUIRED_KEYS, Trial, PeakMemory, GPU_PEAK_LABEL, HOST_PEAK_LABEL,
    peak_memory, Result, resolve_result_path, atomic_file, write_json_atomic
)

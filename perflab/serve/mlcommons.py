"""`perflab serve --loadgen`: MLCommons LoadGen itself (its Python bindings, `mlperf_loadgen`) issues the queries
and judges the point, in front of the same batcher, instances and model that perflab's own load runs.

LoadGen's SUT callback puts each query it issues into perflab's Batcher (the queue that single-stream uses, where
arrivals are put as they come); the instances serve batches from it as in every scenario and report each batch
complete to LoadGen. LoadGen's verdict (VALID/INVALID, its p99, early stopping, samples/s) is read back from its
detail log and kept beside perflab's own figures of the same point, so the two can be compared query for query.
The bindings are optional: `pip install 'perflab[loadgen]'`."""
from __future__ import annotations

import importlib
import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from perflab.errors import PerflabError
from perflab.serve.batcher import Batcher
from perflab.serve.loadgen import prompt_thread_switches
from perflab.serve.metrics import QueryLog
from perflab.serve.server import Server

INSTALL = "pip install 'perflab[loadgen]' (MLCommons LoadGen's Python bindings, the mlcommons-loadgen package)"
SCENARIOS = {"server": "Server", "offline": "Offline", "single-stream": "SingleStream"}
MAX_DURATION_FACTOR = 4  # LoadGen stops issuing after this many times --duration (an overloaded rate)
MAX_QUERIES = 2_000_000  # queries one point may issue (perflab's log of the point is allocated up front)


def bindings() -> Any:
    """The mlperf_loadgen module, or one clear line saying what to install."""
    try:
        return importlib.import_module("mlperf_loadgen")
    except ImportError:
        raise PerflabError(f"--loadgen drives MLCommons LoadGen, which is not installed: {INSTALL}") from None


def test_settings(lg: Any, scenario: str, rate_qps: Optional[float], p99_ms: float, duration_s: float,
                  min_queries: int, expected_qps: float, single_query_ms: float, seed: int, samples: int) -> Any:
    """LoadGen's TestSettings for one point, in performance mode, from perflab's serve settings."""
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, SCENARIOS[scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(1000 * duration_s)
    settings.max_duration_ms = int(1000 * duration_s * MAX_DURATION_FACTOR)
    settings.min_query_count = min_queries
    settings.performance_sample_count_override = samples
    settings.schedule_rng_seed = settings.sample_index_rng_seed = settings.qsl_rng_seed = seed
    if scenario == "server":
        settings.server_target_qps = rate_qps
        settings.server_target_latency_ns = int(p99_ms * 1e6)
        settings.server_target_latency_percentile = 0.99
    elif scenario == "offline":
        settings.offline_expected_qps = expected_qps
    else:
        settings.single_stream_expected_latency_ns = max(1, int(single_query_ms * 1e6))
    return settings


class LoadGenSut:
    """The system under test LoadGen drives: each issued query joins perflab's Batcher; each served batch is
    reported complete. Query i of the point is the i-th LoadGen issued (its LoadGen id and sample index kept)."""

    def __init__(self, lg: Any, capacity: int, max_batch: int, timeout_s: float, clock: Callable[[], float]):
        self.lg = lg
        self.batcher = Batcher(max_batch, timeout_s, clock)
        self.log = QueryLog(np.full(capacity, np.nan))
        self.response_ids = np.zeros(capacity, dtype=np.uint64)
        self.sample_of_query = np.zeros(capacity, dtype=int)
        self.issued = 0
        self._issuing = threading.Lock()

    def issue(self, queries: list) -> None:
        with self._issuing:
            now = self.batcher.clock()
            first, count = self.issued, len(queries)
            if first + count > len(self.response_ids):
                raise PerflabError(f"LoadGen issued more than {len(self.response_ids):,} queries in one point; lower "
                                   "--qps or --duration")
            for offset, query in enumerate(queries):
                self.response_ids[first + offset] = query.id
                self.sample_of_query[first + offset] = query.index
            self.log.scheduled_s[first:first + count] = now
            self.issued += count
            self.batcher.put(range(first, first + count), now)

    def complete(self, query_ids: list[int]) -> None:
        responses = [self.lg.QuerySampleResponse(int(self.response_ids[query]), 0, 0) for query in query_ids]
        self.lg.QuerySamplesComplete(responses)


def run_point(server: Server, settings: Any, max_batch: int, timeout_s: float, samples: int, out: Path,
              expected_queries: int) -> tuple[QueryLog, dict[str, Any]]:
    """One LoadGen test on the server's instances: perflab's log of the queries LoadGen issued (stamped from when
    each was issued to the SUT) and LoadGen's own verdict, read from its detail log in `out`."""
    lg = bindings()
    began = time.perf_counter()
    sut = LoadGenSut(lg, min(MAX_QUERIES, max(4 * expected_queries, 100_000)), max_batch, timeout_s,
                     lambda: time.perf_counter() - began)
    handle = lg.ConstructSUT(sut.issue, lambda: None)
    library = lg.ConstructQSL(samples, samples, lambda ids: None, lambda ids: None)
    out.mkdir(parents=True, exist_ok=True)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(out)
    log_settings.log_output.copy_summary_to_stdout = False
    try:
        with prompt_thread_switches():
            serving = server.start(sut.batcher, sut.log, sut.sample_of_query, on_done=sut.complete)
            try:
                lg.StartTestWithLogSettings(handle, library, settings, log_settings)
            finally:
                sut.batcher.close()
            serving.wait()
    finally:
        lg.DestroyQSL(library)
        lg.DestroySUT(handle)
    return sut.log.truncated(sut.issued), read_verdict(out / "mlperf_log_detail.txt")


# LoadGen's detail log keys, and the names perflab keeps them under
RESULT_KEYS = {"result_validity": "validity", "result_scheduled_samples_per_sec": "scheduled_samples_per_s",
               "result_completed_samples_per_sec": "completed_samples_per_s",
               "result_samples_per_second": "samples_per_s", "result_99.00_percentile_latency_ns": "p99_ns",
               "result_90.00_percentile_latency_ns": "p90_ns", "result_50.00_percentile_latency_ns": "p50_ns",
               "result_min_duration_met": "min_duration_met", "result_min_queries_met": "min_queries_met",
               "result_perf_constraints_met": "perf_constraints_met", "early_stopping_met": "early_stopping_met",
               "result_query_count": "query_count", "early_stopping_result": "early_stopping",
               "result_invalid_reason": "invalid_reasons", "result_early_stopping_99.00_percentile_estimate":
               "early_stopping_p99_estimate_ns"}


def read_verdict(detail: Path) -> dict[str, Any]:
    """LoadGen's result keys from its detail log (`:::MLLOG {json}` lines), under perflab's names, with times in ms."""
    found: dict[str, Any] = {}
    for line in detail.read_text(errors="replace").splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        record = json.loads(line[len(":::MLLOG"):])
        if record.get("key") in RESULT_KEYS:
            found[RESULT_KEYS[record["key"]]] = record.get("value")
    for key in [key for key in found if key.endswith("_ns")]:
        value = found.pop(key)
        found[key[:-3] + "_ms"] = value / 1e6 if isinstance(value, (int, float)) else value
    if "validity" not in found:
        raise PerflabError(f"LoadGen wrote no result_validity to {detail}: see that log for why the test stopped")
    found["log_dir"] = str(detail.parent)
    return found


def expected_queries(scenario: str, rate_qps: Optional[float], duration_s: float, min_queries: int,
                     expected_qps: float) -> int:
    """About how many queries LoadGen will issue in a point (it issues until both minimums are met)."""
    rate = rate_qps if scenario == "server" else expected_qps
    return max(min_queries, math.ceil(1.2 * rate * duration_s * MAX_DURATION_FACTOR))

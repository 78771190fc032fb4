"""A serve session: the server, its settings and the result; runs the scenario's points one at a time and
saves result.json after each (Ctrl-C keeps every finished point)."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from perflab.config import RunConfig
from perflab.harness.nvml import NvmlSampler
from perflab.results.metrics import Serve
from perflab.results import Result
from perflab.serve import loadgen, mlcommons, schedule
from perflab.serve.config import ServeConfig, check_offline_queries, overload_wait_s
from perflab.config import parse_slo
from perflab.serve.metrics import QueryLog, summarize_point, summarize_tokens
from perflab.serve.search import find_max_qps
from perflab.serve.server import Server
from perflab.serve.validity import point_validity

LONGEST_POINT = 4  # a search point lasts at most this many times --duration (to reach --min-queries)
LATE_FLOOR_MS = 1.0
OFFLINE_MARGIN = 1.1


def late_threshold_ms(serve_cfg: ServeConfig) -> float:
    """Dispatch delay (p99 over a point's batches) past which the harness counts as late: the point measured the
    batcher as much as the model."""
    return max(LATE_FLOOR_MS, 0.1 * serve_cfg.p99_ms)


class Session:
    """A serve session's state: the server, its settings, and the result rewritten after each point."""

    def __init__(self, server: Server, cfg: RunConfig, serve_cfg: ServeConfig, result: Result, out: Optional[Path],
                 samples: int, device_index: Optional[int], on_point: Callable[[dict], None]):
        self.server = server
        self.cfg = cfg
        self.serve_cfg = serve_cfg
        self.result = result
        self.out = out
        self.samples = samples
        self.device_index = device_index
        self.on_point = on_point
        self.non_finite: Optional[str] = None  # why the result is invalid: NaN/inf outputs in some point

    @property
    def record(self) -> Serve:
        return self.result.metrics.serve

    def save(self) -> None:
        if self.out is not None:
            self.result.save(self.out)

    def point(self, scenario: str, rate: Optional[float] = None, queries: Optional[int] = None,
              duration_s: Optional[float] = None) -> dict[str, Any]:
        """Run one point, add it to the result, save."""
        sc, max_batch = self.serve_cfg, self.cfg.batch_size
        index = len(self.record.points)
        with NvmlSampler(self.device_index) as sampler:
            if sc.loadgen:
                log, verdict = self._mlcommons_load(scenario, rate, index)
            else:
                log, verdict = self._own_load(scenario, rate, queries, duration_s), None
        point = summarize_point(log, scenario, rate, max_batch, sc.instances, late_threshold_ms(sc),
                                sampler.summary(), self.cfg.gpu_cost_per_hour)
        if log.token_batches:
            point["generation"] = summarize_tokens(log, point["duration_s"], parse_slo(self.cfg.slo))
            engines = [engine for engine in self.server.engines if hasattr(engine, "take_host_times")]
            point["generation"]["engine_host_ms_per_batch"] = engines[0].take_host_times() if engines else None
        point["index"] = index
        point["schedule_seed"] = sc.schedule_seed if scenario == "server" else None
        point["load_generator"] = "MLCommons LoadGen" if verdict is not None else "perflab"
        point["meets_bound"] = bool(point["latency_ms"]["p99"] <= sc.p99_ms)
        if log.overloaded is not None:  # the queue's bound ended the point: beyond capacity, never a pass
            point["overloaded"] = log.overloaded
            point["meets_bound"] = False
            self.result.notes.append(overload_note(point))
        self._check_outputs(point)
        point["validity"] = point_validity(point, log.latency_ms(), float(np.nanmax(log.scheduled_s)), sc.p99_ms,
                                           sc.duration_s, sc.min_queries)
        point["passed"] = point["validity"]["valid"]  # the search takes only a VALID point as a pass
        if verdict is not None:  # LoadGen issued the queries: its own verdict decides, perflab's is kept beside it
            point["loadgen"] = verdict
            point["passed"] = verdict["validity"] == "VALID" and not point.get("non_finite")
        padding = [engine for engine in self.server.engines if hasattr(engine, "padded_samples")]
        point["padded_samples"] = sum(engine.padded_samples for engine in padding)
        for engine in padding:
            engine.padded_samples = 0
        self.record.points.append(point)
        self.save()
        self.on_point(point)
        return point


    def _own_load(self, scenario: str, rate: Optional[float], queries: Optional[int], duration_s: Optional[float]
                  ) -> QueryLog:
        """perflab's own load: the schedule's arrivals read off by the ScheduledBatcher (single-stream: issued as
        each query completes). Every point draws the same samples in the same order, as its arrivals are one
        seed's gaps scaled to its rate."""
        sc, max_batch, timeout_s = self.serve_cfg, self.cfg.batch_size, self.serve_cfg.batch_timeout_ms / 1000
        if scenario == "server":
            arrivals = schedule.poisson_arrivals(rate, duration_s, sc.min_queries, sc.schedule_seed)
            order = schedule.sample_order(len(arrivals), self.samples, sc.sample_seed)
            return loadgen.run_scheduled(self.server, arrivals, order, max_batch, timeout_s,
                                         max_wait_s=overload_wait_s(sc.p99_ms))
        if scenario == "offline":
            order = schedule.sample_order(queries, self.samples, sc.sample_seed)
            return loadgen.run_offline(self.server, queries, order, max_batch, timeout_s)
        order = schedule.sample_order(loadgen.SINGLE_STREAM_CAP, self.samples, sc.sample_seed)
        return loadgen.run_single_stream(self.server, sc.duration_s, sc.min_queries, order)

    def _mlcommons_load(self, scenario: str, rate: Optional[float], index: int) -> tuple[QueryLog, dict]:
        """MLCommons LoadGen issues the point's queries (--loadgen) and judges it; its logs go to
        <out>/loadgen/point-<index>/."""
        sc, record = self.serve_cfg, self.record
        expected_qps = (record.estimated_samples_per_s if scenario == "offline"
                        else 1000 / max(record.single_query_ms, 1e-3) if scenario == "single-stream" else rate)
        lg = mlcommons.bindings()
        settings = mlcommons.test_settings(lg, scenario, rate, sc.p99_ms, sc.duration_s, sc.min_queries,
                                           expected_qps, record.single_query_ms, sc.schedule_seed, self.samples)
        logs = (self.out if self.out is not None else Path(tempfile.mkdtemp())) / "loadgen" / f"point-{index}"
        return mlcommons.run_point(self.server, settings, self.cfg.batch_size, sc.batch_timeout_ms / 1000,
                                   self.samples, logs, mlcommons.expected_queries(
                                       scenario, rate, sc.duration_s, sc.min_queries, expected_qps))

    def _check_outputs(self, point: dict[str, Any]) -> None:
        """NaN/inf in the last batch's results make the point (and the result) invalid, as in `perflab run`."""
        bad = sum(engine.non_finite_outputs() for engine in self.server.engines
                  if hasattr(engine, "non_finite_outputs"))
        if bad:
            point["non_finite"] = (f"the model's outputs hold {bad} NaN/inf value(s) in the point's last batch: "
                                   "timings of a diverged model are not meaningful (check the weights, the inputs "
                                   "and the precision; fp16 overflows at 65504)")
            self.non_finite = point["non_finite"]


def overload_note(point: dict[str, Any]) -> str:
    """One line saying why an overloaded point ended early."""
    over = point["overloaded"]
    return (f"point {point['index']} at {point['offered_qps']:g} queries/s overloaded: after {over['at_s']:.1f} s a "
            f"query had waited {over['waited_s']:.1f} s with {over['waiting']:,} queued; the point was ended with "
            f"{over['unserved']:,} of {point['queries']:,} queries unserved (the rate is beyond what the model serves)")


class Diverged(Exception):
    """The model's outputs held NaN/inf: the search stops (every lower rate would serve the same diverged model)."""


def run_scenario(session: Session, estimate: float) -> None:
    """The scenario's points: one offline or single-stream point, the --qps rates, or the max-QPS search."""
    sc = session.serve_cfg
    if sc.scenario == "offline":
        # LoadGen's margin: 10% more queries than the expected rate serves in --duration, so the point lasts it
        queries = max(sc.min_queries, math.ceil(OFFLINE_MARGIN * estimate * sc.duration_s))
        check_offline_queries(queries, estimate, sc.duration_s)
        session.point("offline", queries=queries)
    elif sc.scenario == "single-stream":
        session.point("single-stream")
    elif sc.find_max_qps:
        search(session, estimate)
    elif sc.rates():  # each was checked against --duration and --min-queries by ServeConfig.validate
        for rate in sc.rates():
            session.point("server", rate=rate, duration_s=sc.duration_s)
            if session.non_finite:
                return  # a diverged model: no further point would mean more
    else:
        rate = _rate(estimate / 2)
        session.point("server", rate=rate, duration_s=max(sc.duration_s, sc.min_queries / rate))


def search(session: Session, estimate: float) -> None:
    """The max-QPS search from half the full-batch throughput; `max_qps` and the bracket go into the record."""
    sc = session.serve_cfg
    tolerance = sc.search_tolerance_pct / 100
    single_ms = session.record.single_query_ms
    if single_ms > sc.p99_ms:
        reason = f"one query alone takes {single_ms:.2f} ms, more than the p99 bound of {sc.p99_ms:g} ms: no rate " \
                 "can meet it"
        session.record.search = {"skipped": reason, "tried": [], "lowest_failing_qps": None,
                                    "tolerance": tolerance, "start_qps": None}
        session.result.notes.append(reason)
        return

    def passes(rate: float) -> bool:  # both minimums, as LoadGen: the duration and the query count
        if session.non_finite:
            raise Diverged(session.non_finite)
        return session.point("server", rate=rate, duration_s=max(sc.duration_s, sc.min_queries / rate))["passed"]
    # A point lasts at most LONGEST_POINT x --duration: halving stops where --min-queries would take longer.
    lowest = sc.min_queries / (LONGEST_POINT * sc.duration_s)
    try:
        outcome = find_max_qps(passes, max(_rate(estimate / 2), lowest), tolerance, lowest_qps=lowest)
    except Diverged as stopped:
        session.record.search = {"skipped": str(stopped), "tried": [{"qps": p["offered_qps"], "passed": False}
                                                                    for p in session.record.points],
                                 "lowest_failing_qps": None, "tolerance": tolerance, "start_qps": None}
        return
    session.record.max_qps = outcome.max_qps
    session.record.search = {"lowest_failing_qps": outcome.lowest_failing_qps, "tolerance": tolerance,
                                "tried": [{"qps": rate, "passed": passed} for rate, passed in outcome.tried],
                                "start_qps": outcome.tried[0][0]}


def _rate(qps: float) -> float:
    """A rate to three significant digits (readable in tables), never rounded to zero."""
    return float(f"{qps:.3g}")

"""A serve session: the server, its settings and the result; runs the scenario's points one at a time and
saves result.json after each (Ctrl-C keeps every finished point)."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from perflab.config import RunConfig
from perflab.harness.nvml import NvmlSampler
from perflab.results.metrics import Extension, LoadPoint, Search, Serve, TriedRate
from perflab.results import Result
from perflab.serve import loadgen, mlcommons, schedule
from perflab.serve.config import (MAX_DURATION_S, MAX_QUERIES_PER_POINT, ServeConfig, check_offline_queries,
                                  overload_wait_s, point_duration_s)
from perflab.config import parse_slo
from perflab.serve.metrics import QueryLog, summarize_point, summarize_tokens
from perflab.serve.search import find_max_qps
from perflab.serve.server import Server
from perflab.serve.validity import point_validity

LONGEST_POINT = 4  # a search point lasts at most this many times --duration (to reach --min-queries)
RERUNS = 2  # a search point too short for early stopping is rerun longer at the same rate at most this many times
RERUN_MARGIN = 1.1  # queries past those the late fraction seen needs: the longer run's late count varies
NOTED_POINTS = 4  # extended points named in the note (then "and N more")
LATE_FLOOR_MS = 1.0
OFFLINE_MARGIN = 1.1


def late_threshold_ms(serve_cfg: ServeConfig) -> float:
    """Dispatch delay (p99 over a point's batches) past which the harness counts as late: the point measured the
    batcher as much as the model."""
    return max(LATE_FLOOR_MS, 0.1 * serve_cfg.p99_ms)


class Session:
    """A serve session's state: the server, its settings, and the result rewritten after each point."""

    def __init__(self, server: Server, cfg: RunConfig, serve_cfg: ServeConfig, result: Result, out: Optional[Path],
                 samples: int, device_index: Optional[int], on_point: Callable[[LoadPoint], None]):
        self.server = server
        self.cfg = cfg
        self.serve_cfg = serve_cfg
        self.result = result
        self.out = out
        self.samples = samples
        self.device_index = device_index
        self.on_point = on_point
        self.non_finite: Optional[str] = None  # why the result is invalid: NaN/inf outputs in some point
        self.extension_note: Optional[int] = None  # index in result.notes of the one line naming extended points

    @property
    def record(self) -> Serve:
        return self.result.metrics.serve

    def save(self) -> None:
        if self.out is not None:
            self.result.save(self.out)

    def point(self, scenario: str, rate: Optional[float] = None, queries: Optional[int] = None,
              duration_s: Optional[float] = None, min_queries: Optional[int] = None,
              why_longer: Optional[str] = None) -> LoadPoint:
        """Run one point, add it to the result, save. `min_queries` (default --min-queries) and `why_longer` are
        a search's rerun of a point too short for early stopping."""
        sc, max_batch = self.serve_cfg, self.cfg.batch_size
        index = len(self.record.points)
        min_queries = min_queries or sc.min_queries
        with NvmlSampler(self.device_index) as sampler:
            if sc.loadgen:
                log, verdict = self._mlcommons_load(scenario, rate, index, min_queries)
            else:
                log, verdict = self._own_load(scenario, rate, queries, duration_s, min_queries), None
        point = summarize_point(log, scenario, rate, max_batch, sc.instances, late_threshold_ms(sc),
                                sampler.summary(), self.cfg.gpu_cost_per_hour)
        if log.token_batches:
            point.generation = summarize_tokens(log, point.duration_s, parse_slo(self.cfg.slo))
            engines = [engine for engine in self.server.engines if hasattr(engine, "take_host_times")]
            point.generation["engine_host_ms_per_batch"] = engines[0].take_host_times() if engines else None
        point.index = index
        point.schedule_seed = sc.schedule_seed if scenario == "server" else None
        point.load_generator = "MLCommons LoadGen" if verdict is not None else "perflab"
        point.meets_bound = bool(point.p99_ms <= sc.p99_ms)
        if log.overloaded is not None:  # the queue's bound ended the point: beyond capacity, never a pass
            point.overloaded = log.overloaded
            point.meets_bound = False
            self.result.notes.append(overload_note(point))
        self._check_outputs(point)
        point.validity = point_validity(point, log.latency_ms(), float(np.nanmax(log.scheduled_s)), sc.p99_ms,
                                        sc.duration_s, sc.min_queries)
        point.passed = point.validity.valid  # the search takes only a VALID point as a pass
        extended = None if log.overloaded is not None else extension(  # overloaded: it did not run its schedule
            log, sc.duration_s, why_longer or f"--min-queries {min_queries:,}")
        if extended is not None:  # LoadGen's two minimums: the point ran past --duration until the count was met
            point.extended = extended
        if verdict is not None:  # LoadGen issued the queries: its own verdict decides, perflab's is kept beside it
            point.loadgen = verdict
            point.passed = verdict["validity"] == "VALID" and not point.non_finite
        padding = [engine for engine in self.server.engines if hasattr(engine, "padded_samples")]
        point.padded_samples = sum(engine.padded_samples for engine in padding)
        for engine in padding:
            engine.padded_samples = 0
        self.record.points.append(point)
        if extended is not None:
            self._note_extensions()
        self.save()
        self.on_point(point)
        return point


    def _note_extensions(self) -> None:
        """One note line naming the points that ran past --duration, rewritten as more do."""
        extended = [point for point in self.record.points if point.extended]
        named = "; ".join(f"point {point.index}"
                          + (f" at {point.offered_qps:g} queries/s" if point.offered_qps else "")
                          + f" issued {point.extended.queries:,} queries over "
                          f"{point.extended.last_query_s:.1f} s for {point.extended.why}"
                          for point in extended[:NOTED_POINTS])
        more = f"; and {len(extended) - NOTED_POINTS} more" if len(extended) > NOTED_POINTS else ""
        note = (f"{len(extended)} point(s) ran past --duration {self.serve_cfg.duration_s:g} s, as LoadGen runs a "
                f"point until both its minimum duration and query count are met: {named}{more}")
        if self.extension_note is None:
            self.extension_note = len(self.result.notes)
            self.result.notes.append(note)
        else:
            self.result.notes[self.extension_note] = note

    def _own_load(self, scenario: str, rate: Optional[float], queries: Optional[int], duration_s: Optional[float],
                  min_queries: int) -> QueryLog:
        """perflab's own load: the schedule's arrivals read off by the ScheduledBatcher (single-stream: issued as
        each query completes). Every point draws the same samples in the same order, as its arrivals are one
        seed's gaps scaled to its rate."""
        sc, max_batch, timeout_s = self.serve_cfg, self.cfg.batch_size, self.serve_cfg.batch_timeout_ms / 1000
        if scenario == "server":
            arrivals = schedule.poisson_arrivals(rate, duration_s, min_queries, sc.schedule_seed)
            order = schedule.sample_order(len(arrivals), self.samples, sc.sample_seed)
            return loadgen.run_scheduled(self.server, arrivals, order, max_batch, timeout_s,
                                         max_wait_s=overload_wait_s(sc.p99_ms))
        if scenario == "offline":
            order = schedule.sample_order(queries, self.samples, sc.sample_seed)
            return loadgen.run_offline(self.server, queries, order, max_batch, timeout_s)
        order = schedule.sample_order(loadgen.SINGLE_STREAM_CAP, self.samples, sc.sample_seed)
        return loadgen.run_single_stream(self.server, sc.duration_s, min_queries, order)

    def _mlcommons_load(self, scenario: str, rate: Optional[float], index: int, min_queries: int
                        ) -> tuple[QueryLog, dict]:
        """MLCommons LoadGen issues the point's queries (--loadgen) and judges it; its logs go to
        <out>/loadgen/point-<index>/."""
        sc, record = self.serve_cfg, self.record
        expected_qps = (record.estimated_samples_per_s if scenario == "offline"
                        else 1000 / max(record.single_query_ms, 1e-3) if scenario == "single-stream" else rate)
        lg = mlcommons.bindings()
        settings = mlcommons.test_settings(lg, scenario, rate, sc.p99_ms, sc.duration_s, min_queries,
                                           expected_qps, record.single_query_ms, sc.schedule_seed, self.samples)
        logs = (self.out if self.out is not None else Path(tempfile.mkdtemp())) / "loadgen" / f"point-{index}"
        return mlcommons.run_point(self.server, settings, self.cfg.batch_size, sc.batch_timeout_ms / 1000,
                                   self.samples, logs, mlcommons.expected_queries(
                                       scenario, rate, sc.duration_s, min_queries, expected_qps))

    def _check_outputs(self, point: LoadPoint) -> None:
        """NaN/inf in the last batch's results make the point (and the result) invalid, as in `perflab run`."""
        bad = sum(engine.non_finite_outputs() for engine in self.server.engines
                  if hasattr(engine, "non_finite_outputs"))
        if bad:
            point.non_finite = (f"the model's outputs hold {bad} NaN/inf value(s) in the point's last batch: "
                                "timings of a diverged model are not meaningful (check the weights, the inputs "
                                "and the precision; fp16 overflows at 65504)")
            self.non_finite = point.non_finite


def extension(log: QueryLog, duration_s: float, why: str) -> Optional[Extension]:
    """How far a point ran past `duration_s` (None: it did not): when its last query arrived (single-stream: was
    issued), the queries that arrived by `duration_s` (the first at or past it included) and all it issued, for
    `why`."""
    scheduled = log.scheduled_s[np.isfinite(log.scheduled_s)]
    by_duration = int((scheduled < duration_s).sum()) + 1
    if scheduled.size <= by_duration:
        return None
    return Extension(duration_s=duration_s, last_query_s=float(scheduled.max()), queries_by_duration=by_duration,
                     queries=int(scheduled.size), why=why)


def overload_note(point: LoadPoint) -> str:
    """One line saying why an overloaded point ended early."""
    over = point.overloaded
    return (f"point {point.index} at {point.offered_qps:g} queries/s overloaded: after {over.at_s:.1f} s a "
            f"query had waited {over.waited_s:.1f} s with {over.waiting:,} queued; the point was ended with "
            f"{over.unserved:,} of {point.queries:,} queries unserved (the rate is beyond what the model serves)")


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
            session.point("server", rate=rate, duration_s=point_duration_s(rate, sc.duration_s, sc.min_queries))
            if session.non_finite:
                return  # a diverged model: no further point would mean more
    else:
        rate = _rate(estimate / 2)
        session.point("server", rate=rate, duration_s=point_duration_s(rate, sc.duration_s, sc.min_queries))


def search(session: Session, estimate: float) -> None:
    """The max-QPS search from half the full-batch throughput; `max_qps` and the bracket go into the record."""
    sc = session.serve_cfg
    tolerance = sc.search_tolerance_pct / 100
    single_ms = session.record.single_query_ms
    if single_ms > sc.p99_ms:
        reason = f"one query alone takes {single_ms:.2f} ms, more than the p99 bound of {sc.p99_ms:g} ms: no rate " \
                 "can meet it"
        session.record.search = Search(skipped=reason, tolerance=tolerance)
        session.result.notes.append(reason)
        return

    def passes(rate: float) -> bool:  # both minimums, as LoadGen: the duration and the query count
        if session.non_finite:
            raise Diverged(session.non_finite)
        point = session.point("server", rate=rate, duration_s=point_duration_s(rate, sc.duration_s, sc.min_queries))
        for _ in range(RERUNS):  # a point too short to show its p99 is rerun longer: the rate is not lowered for it
            longer = rerun_queries(point, rate)
            if longer is None:
                break
            stopping = point.validity.early_stopping
            why = (f"early stopping: point {point.index} had {stopping.late_queries:,} of "
                   f"{stopping.queries:,} queries late, too few queries to show its p99 within the bound")
            point.rerun_as = len(session.record.points)
            point = session.point("server", rate=rate, duration_s=point_duration_s(rate, sc.duration_s, longer),
                                  min_queries=longer, why_longer=why)
        return point.passed
    # A point lasts at most LONGEST_POINT x --duration: halving stops where --min-queries would take longer.
    lowest = sc.min_queries / (LONGEST_POINT * sc.duration_s)
    try:
        outcome = find_max_qps(passes, max(_rate(estimate / 2), lowest), tolerance, lowest_qps=lowest)
    except Diverged as stopped:
        session.record.search = Search(skipped=str(stopped), tolerance=tolerance,
                                       tried=[TriedRate(qps=p.offered_qps) for p in session.record.points])
        return
    session.record.max_qps = outcome.max_qps
    session.record.search = Search(lowest_failing_qps=outcome.lowest_failing_qps, tolerance=tolerance,
                                   tried=[TriedRate(qps=rate, passed=passed) for rate, passed in outcome.tried],
                                   start_qps=outcome.tried[0][0])


def rerun_queries(point: LoadPoint, rate: float) -> Optional[int]:
    """The queries a longer run of an INVALID point needs, when it was too short (not too slow) to be VALID: the
    count early stopping needs at the late fraction it saw, with a margin (None: not too short, or past the
    limits of a point)."""
    validity = point.validity
    if point.passed or validity is None or not validity.too_short or validity.early_stopping is None:
        return None
    needed = validity.early_stopping.queries_to_show
    if needed is None:
        return None
    queries = math.ceil(RERUN_MARGIN * needed)
    if queries <= validity.early_stopping.queries or queries > MAX_QUERIES_PER_POINT \
            or queries / rate > MAX_DURATION_S:
        return None
    return queries


def _rate(qps: float) -> float:
    """A rate to three significant digits (readable in tables), never rounded to zero."""
    return float(f"{qps:.3g}")

"""ServeConfig: how `perflab serve` loads the model (scenario, rates, bounds, batcher), one option per field."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from perflab import options
from perflab.errors import PerflabError
from perflab.options import option

SCENARIOS = ("server", "offline", "single-stream")
SERVE = ("serve",)
SERVE_AND_TUNE = ("serve", "tune")  # the settings `perflab tune --objective max-qps` passes to its serve trials
LOAD = "load (LoadGen scenarios)"
MAX_QUERIES_PER_POINT = 2_000_000  # a point's schedule is held in memory; past this a rate is not a serving load
MAX_DURATION_S = 86_400.0  # a day of load per point: past it a point is a soak test, not a measurement
BATCHER = "dynamic batcher"
MAX_INSTANCES_PER_CPU = 4  # model instances beyond this many per usable CPU only contend for the cores


@dataclass
class ServeConfig:
    """One serve session: the scenario and its load, the latency bound, and the batching policy."""

    scenario: str = option("--scenario", str, "server: Poisson arrivals at --qps; offline: every query at once "
                           "(the throughput ceiling); single-stream: one query at a time (the latency floor) "
                           "(default: server)", LOAD, "server", choices=SCENARIOS, commands=SERVE)
    qps: Optional[str] = option("--qps", str, "server: offered queries per second; a comma list (100,200,400) "
                                "sweeps a latency-vs-load curve (default: half the full-batch throughput)", LOAD,
                                metavar="RATE[,RATE...]", commands=SERVE)
    find_max_qps: bool = option("--find-max-qps", bool, "server: search the highest rate whose p99 meets --p99-ms "
                                "(widen, then bisect, as LoadGen's peak finder)", LOAD, False, commands=SERVE)
    p99_ms: float = option("--p99-ms", float, "the p99 latency bound a server point must meet (default: 15; tune "
                           "--objective max-qps: required)", LOAD,
                           15.0, above=0, metavar="MS", commands=SERVE_AND_TUNE)
    search_tolerance_pct: float = option("--search-tolerance-pct", float, "the search stops when the bracket around "
                                         "the max QPS is narrower than this, in percent (default: 5)", LOAD, 5.0,
                                         above=0, metavar="PCT", commands=SERVE_AND_TUNE)
    duration_s: float = option("--duration", float, "seconds of load per point at least; a point runs longer until "
                               "--min-queries have arrived too, as LoadGen does (default: 2; at most a day)", LOAD, 2.0,
                               above=0, maximum=MAX_DURATION_S, metavar="SECONDS", commands=SERVE_AND_TUNE)
    min_queries: int = option("--min-queries", int, "queries per point at least (a point runs past --duration until "
                              "they have arrived), so a short lucky run cannot pass; a p99 needs 459 with none late "
                              "for early stopping to pass, 1,024 let up to 3 be late (default: 1024)", LOAD, 1024,
                              minimum=1, maximum=MAX_QUERIES_PER_POINT, metavar="N", commands=SERVE_AND_TUNE)
    schedule_seed: int = option("--schedule-seed", int, "seed of the Poisson arrival times (default: 0)", LOAD, 0,
                                minimum=0, maximum=options.MAX_SEED, metavar="N", commands=SERVE)
    sample_seed: int = option("--sample-seed", int, "seed of the order samples are drawn in (default: 0)", LOAD, 0,
                              minimum=0, maximum=options.MAX_SEED, metavar="N", commands=SERVE)
    loadgen: bool = option("--loadgen", bool, "MLCommons LoadGen itself issues the queries and judges each point "
                           "(its Server, Offline and SingleStream scenarios) in front of the same batcher and model: "
                           "MLPerf-comparable numbers; needs pip install 'perflab[loadgen]'", LOAD, False,
                           commands=SERVE)
    max_batch: Optional[int] = option("--batcher-max-batch", int, "largest batch the batcher forms (default: the "
                                      "workload's batch size on this device; formerly --max-batch)", BATCHER,
                                      minimum=1, metavar="N", commands=SERVE_AND_TUNE, deprecated=("--max-batch",))
    batch_timeout_ms: float = option("--batch-timeout-ms", float, "how long the oldest waiting query may wait for "
                                     "a batch to fill (default: 2)", BATCHER, 2.0, minimum=0, metavar="MS",
                                     commands=SERVE_AND_TUNE)
    bucket_step: int = option("--bucket-step", int, "with --compile or --cuda-graphs a batch is padded up to a size "
                              "compiled or captured in warm-up: powers of two up to N, then every multiple of N up "
                              "to --batcher-max-batch (default: 16; a batch of 33 then runs at 48, not 64)", BATCHER,
                              16, minimum=1, metavar="N", commands=SERVE_AND_TUNE)
    instances: int = option("--instances", int, "model instances, each on its own CUDA stream with its own pinned "
                            "buffers; at most 4 per usable CPU (default: 1)", BATCHER, 1, minimum=1,
                            per_cpu=MAX_INSTANCES_PER_CPU, metavar="N", commands=SERVE_AND_TUNE)

    def validate(self) -> "ServeConfig":
        """Raise PerflabError naming the first bad setting."""
        options.validate(self)
        rates = self.rates()
        if self.scenario != "server" and (rates or self.find_max_qps):
            raise PerflabError(f"--qps and --find-max-qps apply to --scenario server, not {self.scenario}")
        if rates and self.find_max_qps:
            raise PerflabError("give either --qps (fixed rates) or --find-max-qps (a search), not both")
        for rate in rates:
            check_query_count(rate, self.duration_s, self.min_queries)
        return self

    def rates(self) -> list[float]:
        """The offered rates of --qps, in the order given."""
        if self.qps is None:
            return []
        rates = []
        for part in str(self.qps).split(","):
            try:
                rate = float(part)
            except ValueError:
                raise PerflabError(f"--qps: cannot read {part.strip()!r} as a rate (queries per second)") from None
            if not rate > 0 or math.isinf(rate):
                raise PerflabError(f"--qps must be positive rates, got {part.strip()}")
            rates.append(rate)
        return rates

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_argv(self) -> list[str]:
        return options.to_argv(self, "serve")


# A server point ends as 'overloaded' once its oldest waiting query has waited this many times the p99 bound (at
# least OVERLOAD_FLOOR_S): the rate is beyond capacity, and serving the rest of its schedule would only take hours.
OVERLOAD_WAIT_FACTOR = 20
OVERLOAD_FLOOR_S = 1.0


def overload_wait_s(p99_ms: float) -> float:
    """How long the oldest waiting query may wait before a server point is ended as overloaded."""
    return max(OVERLOAD_FLOOR_S, OVERLOAD_WAIT_FACTOR * p99_ms / 1000)


def check_offline_queries(queries: int, estimate_qps: float, duration_s: float) -> None:
    """An offline point issues its queries at once, each held in memory: at most MAX_QUERIES_PER_POINT."""
    if queries > MAX_QUERIES_PER_POINT:
        longest_s = max(1, math.floor(MAX_QUERIES_PER_POINT / queries * duration_s))
        raise PerflabError(f"--scenario offline for --duration {duration_s:g} s at the estimated {estimate_qps:,.0f} "
                           f"queries/s issues about {queries:,} queries at once, more than the "
                           f"{MAX_QUERIES_PER_POINT:,} perflab holds in one point; use --duration {longest_s:g} or less")


def check_query_count(rate: float, duration_s: float, min_queries: int) -> None:
    """A point at `rate` runs until both `duration_s` and `min_queries` are met (LoadGen's two minimums): at most
    MAX_QUERIES_PER_POINT queries (its schedule is held in memory) and at most MAX_DURATION_S seconds."""
    expected = rate * duration_s
    if expected > MAX_QUERIES_PER_POINT:
        raise PerflabError(f"--qps {rate:g} for --duration {duration_s:g} s schedules about {expected:,.0f} queries "
                           f"in one point, more than the {MAX_QUERIES_PER_POINT:,} perflab holds; lower --qps or "
                           "--duration (--find-max-qps finds the highest rate the model sustains)")
    if min_queries / rate > MAX_DURATION_S:
        raise PerflabError(f"--min-queries {min_queries:,} at --qps {rate:g} takes about {min_queries / rate:,.0f} s, "
                           f"longer than a point may run ({MAX_DURATION_S:,.0f} s, a day); raise --qps or lower "
                           "--min-queries")


def point_duration_s(rate: float, duration_s: float, min_queries: int) -> float:
    """How long a point at `rate` runs: until both `duration_s` has passed and `min_queries` have arrived."""
    return max(duration_s, min_queries / rate)

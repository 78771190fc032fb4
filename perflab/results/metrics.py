"""Metrics: the typed tree of a run's aggregate figures, the `metrics` object of result.json.

One place to add a metric: a field on the section it belongs to. Attribute names are the JSON keys (units in the
names), so result.json reads as before; a section a run does not have is None (and left out of the JSON).
Keys this perflab does not know are kept in each section's `extra` and written back, so nothing read is lost.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from perflab.results.records import field_types, load_value

OMIT = {"omit_when_none": True}  # field metadata: a None value is left out of the JSON, as before typing


def optional() -> Any:
    """A field that is None when a run does not have it, and then absent from result.json."""
    return field(default=None, metadata=OMIT)


@dataclass
class Section:
    """Base of every metrics section: JSON in and out, keeping keys it does not know in `extra`."""

    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]):
        """The section from its JSON object (None stays None)."""
        if data is None:
            return None
        if isinstance(data, cls):
            return data
        hints = field_types(cls)
        known, extra = {}, {}
        for key, value in data.items():
            if key in hints and key != "extra":
                known[key] = load_value(hints[key], value)
            else:
                extra[key] = value
        return cls(extra=extra, **known)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field (None-valued optional ones left out), then the unknown keys."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_when_none"):
                continue
            out[f.name] = _encode(value)
        out.update(self.extra)
        return out


def _encode(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, list):
        return [_encode(item) for item in value]
    return value


# --- the harness's figures --------------------------------------------------------------------------------

@dataclass
class Throughput(Section):
    """Samples/s over trials: median, spread and a bootstrap CI (perflab.stats.summarize)."""

    median: Optional[float] = None
    mean: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None
    stdev: Optional[float] = None
    range_pct: Optional[float] = None  # (max - min) / median: how much the trials disagree
    ci95_low: Optional[float] = None
    ci95_high: Optional[float] = None
    n: Optional[int] = None


@dataclass
class Latency(Section):
    """Per-step (or per-request) milliseconds over all timed steps."""

    p50: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None


@dataclass(frozen=True)
class PeakMemory:
    """One peak-memory figure and what it measures (GPU allocations or the whole host process)."""

    mb: Optional[float]
    on_gpu: bool
    label: str  # e.g. "GPU peak allocated": names the figure in tables, notes and plot titles


GPU_PEAK_LABEL = "GPU peak allocated"
HOST_PEAK_LABEL = "host peak RSS (whole process)"


@dataclass
class Memory(Section):
    """Peak device memory (CUDA) or the host process's peak RSS (CPU)."""

    peak_allocated_mb: Optional[float] = optional()
    peak_reserved_mb: Optional[float] = optional()
    device_total_mb: Optional[float] = optional()
    peak_allocated_incl_warmup_mb: Optional[float] = optional()  # CUDA graphs' pools are allocated in warm-up
    host_peak_rss_mb: Optional[float] = optional()

    @property
    def peak(self) -> PeakMemory:
        """The one peak figure to show: GPU peak allocated when measured, else the host's peak RSS."""
        if self.peak_allocated_mb is not None:
            return PeakMemory(self.peak_allocated_mb, True, GPU_PEAK_LABEL)
        return PeakMemory(self.host_peak_rss_mb, False, HOST_PEAK_LABEL)


@dataclass
class Flops(Section):
    """FLOPs per sample (torch.utils.flop_counter), achieved TFLOP/s and MFU against the calibrated peak."""

    per_sample: Optional[float] = None
    achieved_tflops: Optional[float] = None
    peak_tflops: Optional[float] = None
    peak_source: Optional[str] = None
    mfu_pct: Optional[float] = None
    note: Optional[str] = optional()
    peak_note: Optional[str] = optional()  # distributed: MFU against world x one device's peak


@dataclass
class Gpu(Section):
    """NVML samples over the timed trials (harness/nvml.py); only `error` when NVML could not sample."""

    samples: Optional[int] = optional()
    util_mean_pct: Optional[float] = optional()
    util_min_pct: Optional[float] = optional()
    util_max_pct: Optional[float] = optional()
    memory_used_max_mb: Optional[float] = optional()
    sm_clock_median_mhz: Optional[float] = optional()
    sm_clock_min_mhz: Optional[float] = optional()
    sm_clock_max_mhz: Optional[float] = optional()
    clock_event_reasons: Optional[list[str]] = optional()
    error: Optional[str] = None


@dataclass
class Interference(Section):
    """Whether other processes used the machine during the trials (harness/interference.py)."""

    busy: bool = False
    busy_trials: list[int] = field(default_factory=list)
    other_cpu_cores_max: Optional[float] = None
    load_per_core_max: Optional[float] = None
    gpu_neighbours: list[int] = field(default_factory=list)
    threshold_cores: Optional[float] = None
    method: str = ""
    # the largest share of a trial the timing process waited for a CPU; the most other tasks runnable through a trial
    run_queue_wait_max: Optional[float] = field(default=None, metadata=OMIT)
    others_runnable_max: Optional[int] = field(default=None, metadata=OMIT)


@dataclass
class SteadyState(Section):
    """The untimed windows run until a loader's step time settled (harness/steady.reach_steady_state)."""

    steps: Optional[int] = None
    seconds: Optional[float] = None
    step_s: Optional[float] = None
    settled: Optional[bool] = None
    window_step_ms: list[float] = field(default_factory=list)


@dataclass
class UnsteadyPhase(Section):
    """The phase whose time moved most between trials of an unsteady run (harness/steady.moving_phase)."""

    phase: Optional[str] = None
    low_ms: Optional[float] = None
    high_ms: Optional[float] = None
    other_phases_range_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Trend(Section):
    """Throughput drifting one way over the trials (harness/steady.trend)."""

    direction: Optional[str] = None
    first: Optional[float] = None
    last: Optional[float] = None
    change_pct: Optional[float] = None


# --- the optional sections of generation, serve and distributed runs --------------------------------------

@dataclass
class BandwidthBoundSummary(Section):
    """Decode against memory bandwidth: the fastest a step can read the weights and KV cache, and the measured step."""

    weight_bytes: Optional[float] = None
    kv_bytes_per_position: Optional[float] = None
    memory_gbps: Optional[float] = None
    memory_gbps_source: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    bound_ms_per_token: Optional[float] = None
    measured_ms_per_token: Optional[float] = None
    measured_over_bound: Optional[float] = None
    pct_of_bound: Optional[float] = None
    host_issue_ms_per_token: Optional[float] = None
    device_wait_ms_per_token: Optional[float] = None
    compute_ms_per_token: Optional[float] = None
    achieved_gbps: Optional[float] = optional()


@dataclass
class Goodput(Section):
    """With --slo: the share of requests meeting every bound, and requests/s counting only those."""

    slo_ms: dict[str, float] = field(default_factory=dict)
    requests_meeting_slo_pct: Optional[float] = None
    goodput_requests_per_s: Optional[float] = None


@dataclass
class Speculative(Section):
    """Speculative decoding's rounds and acceptance; its speed-up over plain decoding from the quality gate."""

    k: Optional[int] = None
    rounds: Optional[int] = None
    proposed_tokens: Optional[int] = None
    accepted_tokens: Optional[int] = None
    acceptance_rate: Optional[float] = None
    tokens_per_target_forward: Optional[float] = None
    speedup_vs_plain: Optional[float] = optional()
    speedup_method: Optional[str] = optional()


@dataclass
class DecodeCompile(Section):
    """How the decode step was compiled, and who captured its CUDA graphs (generation/plan.py)."""

    mode: Optional[str] = None
    decode_tuning: Optional[Any] = None
    inductor_options: Optional[dict[str, Any]] = None
    decode_sdpa: Optional[str] = None
    graphs: Optional[str] = None  # "inductor" | "perflab" | None
    cudagraph_skips: Optional[int] = None  # Inductor's graphs: compiled graphs that ran without one
    captured_lengths: Optional[list[int]] = None  # perflab's graphs: the token counts captured


@dataclass
class Generation(Section):
    """Per-request figures of a token-generating run (generation/metrics.summarize_requests)."""

    # what was timed: "step" (perflab's decode loop over the model's one-token step, generation/decode.py) or "loop"
    # (the workload's own generation loop called whole, e.g. transformers' generate: generation/loop_timing.py)
    timed_path: Optional[str] = None
    requests: Optional[int] = None
    request_batches: Optional[int] = None
    output_tokens: Optional[int] = None
    ttft_ms: Optional[Latency] = None
    tpot_ms: Optional[Latency] = None
    itl_ms: Optional[Latency] = None
    e2e_latency_ms: Optional[Latency] = None
    output_tokens_per_s: Optional[float] = None
    requests_per_s: Optional[float] = None
    prompt_len_mean: Optional[float] = None
    output_len_mean: Optional[float] = None
    bandwidth_bound: Optional[BandwidthBoundSummary] = None
    goodput: Optional[Goodput] = optional()
    levers: Optional[dict[str, Any]] = None  # the decode levers of the run, as configured
    decode_compile: Optional[DecodeCompile] = None
    speculative: Optional[Speculative] = optional()
    decode_regime: Optional[dict[str, Any]] = None  # the decode finding (diagnose/decode.py), as a record


@dataclass
class ServeSettings(Section):
    """The batcher and load settings a serve run used."""

    max_batch: Optional[int] = None
    batch_timeout_ms: Optional[float] = None
    instances: Optional[int] = None
    p99_ms: Optional[float] = None
    duration_s: Optional[float] = None
    min_queries: Optional[int] = None
    buckets: Optional[list[int]] = None
    bucket_step: Optional[int] = None
    harness_late_ms: Optional[float] = None


@dataclass
class DispatchDelay(Section):
    """How late the batcher dispatched a point's batches against when due (serve/metrics.dispatch_lateness)."""

    p99_ms: Optional[float] = None
    max_ms: Optional[float] = None


@dataclass
class EarlyStopping(Section):
    """LoadGen's early-stopping test of a point (serve/validity.early_stopping): late queries, the queries that many
    late ones need, and the p99 those queries support (None: too few queries for any)."""

    late_queries: int = 0
    queries: int = 0
    queries_needed: Optional[int] = None
    met: bool = False
    confidence: Optional[float] = None
    p99_estimate_ms: Optional[float] = None
    queries_to_show: Optional[int] = optional()  # server: what a longer run at the same late fraction needs


@dataclass
class PointValidity(Section):
    """VALID or INVALID as LoadGen judges a point (serve/validity.point_validity), every reason, and warnings."""

    valid: bool = False
    reasons: list[str] = field(default_factory=list)
    # None (and absent from the JSON) only in a record from before perflab wrote them
    flags: Optional[list[str]] = optional()
    early_stopping: Optional[EarlyStopping] = optional()  # None: offline (no latency bound to test)
    too_short: Optional[bool] = optional()  # only its length made it INVALID: a longer run at the same rate could pass

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.too_short is not None and self.early_stopping is None:  # a full record: offline says it had none
            out["early_stopping"] = None
        return out


@dataclass
class Overload(Section):
    """Why a server point ended at the queue's bound (serve/batcher.py): when, how long its oldest query had waited,
    how many were queued, and how many of the schedule's queries were never served."""

    at_s: Optional[float] = None
    waited_s: Optional[float] = None
    waiting: Optional[int] = None
    unserved: int = 0


@dataclass
class Extension(Section):
    """How far a point ran past --duration to meet its query count, as LoadGen runs one (serve/session.extension)."""

    duration_s: Optional[float] = None
    last_query_s: Optional[float] = None
    queries_by_duration: Optional[int] = None
    queries: Optional[int] = None
    why: str = ""


@dataclass
class LoadPoint(Section):
    """One load point of a serve run (serve/metrics.summarize_point, then serve/session.Session.point).

    `latency_ms` keeps its JSON keys (p50 ... p99.9, mean, max: "p99.9" is no attribute name); `time_ms` holds the
    mean ms per part of a query's life over all queries ("mean") and the p99 tail ("tail"). Fields a point has only
    sometimes are None and left out of the JSON."""

    scenario: Optional[str] = None  # "server" | "offline" | "single-stream"
    offered_qps: Optional[float] = None  # the nominal rate (None: offline and single-stream)
    realised_offered_qps: Optional[float] = None  # the rate the seeded schedule really offered (server only)
    achieved_qps: Optional[float] = None
    queries: int = 0
    completed: int = 0
    duration_s: Optional[float] = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    time_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    batches: int = 0
    batch_histogram: dict[Any, int] = field(default_factory=dict)  # batch size -> batches (str keys once loaded)
    batch_mean: float = 0.0
    batch_fill_pct: float = 0.0
    instance_busy_pct: Optional[float] = None
    dispatch_delay_ms: Optional[DispatchDelay] = optional()
    harness_late: Optional[bool] = optional()  # the point measured the harness too: not valid (absent in old files)
    gpu: Optional[dict[str, Any]] = None  # the NVML sampler's summary over the point
    cost_per_million_queries: Optional[float] = None
    generation: Optional[dict[str, Any]] = optional()  # TTFT, TPOT, ITL, tokens/s of a generating workload
    index: Optional[int] = None
    schedule_seed: Optional[int] = None
    load_generator: Optional[str] = optional()  # "perflab" | "MLCommons LoadGen"
    meets_bound: bool = False  # p99 within --p99-ms
    overloaded: Optional[Overload] = optional()  # the queue's bound ended the point
    non_finite: Optional[str] = optional()  # why NaN/inf outputs make the point invalid
    validity: Optional[PointValidity] = optional()  # serve/validity.point_validity (absent before validity)
    passed: bool = False  # VALID (or LoadGen's VALID): the search takes only these as a pass
    extended: Optional[Extension] = optional()  # how far the point ran past --duration
    loadgen: Optional[dict[str, Any]] = optional()  # MLCommons LoadGen's own verdict
    padded_samples: Optional[int] = optional()
    rerun_as: Optional[int] = optional()  # the index of its longer rerun (too short, not too slow)

    @property
    def p99_ms(self) -> Optional[float]:
        """The nearest-rank p99 latency the point is judged by."""
        return self.latency_ms.get("p99")

    @property
    def offered(self) -> Optional[float]:
        """The rate the schedule really offered where recorded, else the nominal rate."""
        return self.realised_offered_qps or self.offered_qps


@dataclass
class TriedRate(Section):
    """One rate the max-QPS search tried, and whether its point passed."""

    qps: Optional[float] = None
    passed: bool = False


@dataclass
class Search(Section):
    """The max-QPS search (serve/session.search): every rate tried, the bracket above the peak, the bisection's
    relative tolerance; `skipped` says why it stopped before finding one (no rate can meet the bound, NaN/inf)."""

    skipped: Optional[str] = optional()
    tried: list[TriedRate] = field(default_factory=list)
    lowest_failing_qps: Optional[float] = None
    tolerance: Optional[float] = None  # relative: 0.05 is 5%
    start_qps: Optional[float] = None


@dataclass
class Capacity(Section):
    """The harness's own capacity with a no-op model (serve/capacity.measure_capacity)."""

    batcher_qps_at_max_batch: Optional[float] = None
    batcher_batches_per_s: Optional[float] = None
    dispatch_probe_qps: Optional[float] = optional()  # the fast Poisson schedule's rate
    dispatch_delay_p99_ms: Optional[float] = optional()  # absent before arrivals were virtual
    dispatch_delay_max_ms: Optional[float] = optional()
    probe_queries: Optional[int] = optional()
    model: Optional[str] = optional()
    loadgen_issue_qps: Optional[float] = optional()  # results from before arrivals were virtual only


@dataclass
class Serve(Section):
    """A `perflab serve` run: its settings, one record per load point, the max-QPS search and capacity."""

    scenario: Optional[str] = None
    schedule_seed: Optional[int] = None
    sample_seed: Optional[int] = None
    settings: ServeSettings = field(default_factory=ServeSettings)
    estimated_samples_per_s: Optional[float] = None
    points: list[LoadPoint] = field(default_factory=list)  # one per load point (serve/session.py)
    max_qps: Optional[float] = None
    search: Optional[Search] = None  # None: no max-QPS search (fixed rates, offline, single-stream)
    capacity: Optional[Capacity] = None
    complete: bool = False
    single_query_ms: Optional[float] = None


@dataclass
class RankFigures(Section):
    """One rank's own figures in a distributed run."""

    rank: Optional[int] = None
    local_rank: Optional[int] = None
    host: Optional[str] = None
    throughput_samples_per_s: Optional[float] = None
    step_ms_mean: Optional[float] = None
    step_ms_p50: Optional[float] = None
    phases_ms: dict[str, float] = field(default_factory=dict)
    memory: Memory = field(default_factory=lambda: Memory())
    gpu: Optional[Gpu] = None
    collectives: Optional[dict[str, Any]] = optional()  # only while gathering: becomes metrics.collectives


@dataclass
class Distributed(Section):
    """A run over several ranks (distributed/gather.py): throughput per rank, stragglers, each rank's figures."""

    world_size: Optional[int] = None
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    parallel: Optional[str] = None
    backend: Optional[str] = None
    global_batch_size: Optional[int] = None
    throughput_per_rank_samples_per_s: Optional[float] = None
    straggler_spread_pct: Optional[float] = None
    slowest_rank: Optional[int] = None
    per_rank: list[RankFigures] = field(default_factory=list)


# --- the tree -----------------------------------------------------------------------------------------------

@dataclass
class Metrics(Section):
    """A run's aggregate figures. Every section is None where the run has none (a serve run has no
    throughput_samples_per_s; a run stopped before its first trial has only warm-up figures)."""

    throughput_samples_per_s: Optional[Throughput] = None
    latency_ms: Optional[Latency] = None
    phases_ms: dict[str, float] = field(default_factory=dict)  # median ms per step, by phase
    phase_share_pct: dict[str, float] = field(default_factory=dict)  # share of the mean step, by phase
    batch_size: Optional[int] = None
    warmup_s: Optional[float] = None
    first_step_s: Optional[float] = None
    memory: Optional[Memory] = None
    gpu: Optional[Gpu] = None
    cost_per_million_samples: Optional[float] = None
    flops: Optional[Flops] = None
    compile_s: Optional[float] = None
    interference: Optional[Interference] = None
    steady_state: Optional[SteadyState] = None
    steady: Optional[bool] = None
    unsteady_phase: Optional[UnsteadyPhase] = None
    throughput_trend: Optional[Trend] = None
    # Optional sections: absent from result.json when a run has none.
    generation: Optional[Generation] = optional()
    serve: Optional[Serve] = optional()
    distributed: Optional[Distributed] = optional()
    global_batch_size: Optional[int] = optional()  # distributed: batch_size x ranks
    collectives: Optional[dict[str, Any]] = optional()  # communication profile (distributed/collectives.py)
    profile: Optional[dict[str, Any]] = optional()  # how `perflab profile` captured the trace
    steps_per_s: Optional[float] = optional()  # script runs (perflab run -- python train.py)
    steps_seen: Optional[int] = optional()
    script_s: Optional[float] = optional()

    @property
    def throughput(self) -> Optional[float]:
        """Median samples/s over trials (None for a run without trials, e.g. serve)."""
        return self.throughput_samples_per_s.median if self.throughput_samples_per_s else None

    @property
    def peak_memory(self) -> PeakMemory:
        """The run's peak memory: GPU peak allocated when on CUDA, else the host process's peak RSS."""
        return (self.memory or Memory()).peak


def migrate_v1(metrics: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 `metrics` object as schema 2 reads it.

    Schema 2 kept every key name of schema 1; what changed is that the object is a typed tree (sections absent or
    null where a run has none) and that nothing else (trials, notes, timing) travels in it. Schema 1 wrote an empty
    object for a section a run lacked in places (a CPU rank's "gpu": {} in distributed.per_rank); schema 2 reads
    those as None, and writes them so."""
    migrated = {key: (None if value == {} and key in _SECTION_KEYS else value) for key, value in metrics.items()}
    distributed = migrated.get("distributed")
    if isinstance(distributed, dict) and distributed.get("per_rank"):
        migrated["distributed"] = {**distributed, "per_rank": [
            {key: (None if value == {} and key == "gpu" else value) for key, value in rank.items()}
            for rank in distributed["per_rank"]]}
    return migrated


_SECTION_KEYS = {f.name for f in dataclasses.fields(Metrics) if f.name not in ("extra", "phases_ms", "phase_share_pct")}

"""The scaling model of `perflab scale --predict 2,8,64,512`: step time and efficiency at N GPUs per node x M nodes,
from a one-GPU run's step breakdown, the model's parameter bytes and the links' bandwidth and latency.

Every collective costs alpha + S x f / busbw (the alpha-beta model, with nccl-tests' bus factor f: 2(W-1)/W for an
all-reduce, (W-1)/W for an all-gather or reduce-scatter, S the whole tensor's bytes). Within a node alpha and busbw
are measured (`perflab calibrate --collectives`) or, where they were not, the GPU's nominal link; across nodes they
are stated (--inter-node-gbps per GPU, --inter-node-latency-us per tree level) and printed as assumptions. Across M
nodes a ring runs at the slower of the two links and pays the inter-node latency once per level of a tree
(ceil(log2 M)). The per-GPU batch stays the same (weak scaling), so the compute of a step does not change.

DDP: the gradient all-reduce runs in K buckets of the bucket size, which become ready evenly through backward and
run one after another on the communication stream; each takes c = alpha + (G/K) x f / busbw. The step waits for
what is left after backward:
    exposed = max(c, K x c - backward x (K-1)/K)
FSDP2: U units (the workload's blocks) of P/U parameters each; an all-gather a per unit in forward and again in
backward (unless the unit keeps its parameters), a reduce-scatter r per unit in backward. With the next unit
prefetched, a unit's communication hides under the current unit's compute (forward f = forward/U, backward
b = backward/U) and only the excess waits; the first all-gather and the last reduce-scatter cannot hide:
    exposed forward  = a + (U-1) x max(0, a - f)
    exposed backward = [a] + (U-1) x max(0, a + r - b) + r      ([a]: the first unit's re-gather, when resharded)
and the optimizer keeps its one-GPU time (on a shard its element work shrinks 1/W, but not its per-tensor launches,
which lead in small models). Step(W) = forward + backward + optimizer + other + exposed + tax;
efficiency = step(1) / step(W). The tax is the step's growth beyond exposed communication (NCCL's kernels slowing
the compute they overlap, the wrapper's hooks, ranks waiting), fitted from the measured multi-GPU points below the
predicted count: held from one, a line in the overlapped communication from two (perflab/sweep/overlap_tax.py);
none where only one GPU ran. Left out: stragglers, the compute's slowdown lengthening the backward that hides
communication, and a deeper prefetch than one unit (in this even model it changes nothing once the links are the
limit).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Optional

from perflab.calibrate_collectives import CollectivesCalibration, PeerLink, collective_seconds
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.options import option
from perflab.sweep.overlap_tax import NO_TAX, OverlapTax, fit_overlap_tax, tax_point
from perflab.sweep.point import ScaleRow

PREDICT = "scaling model (--predict)"
SCALE = ("scale",)
DDP_DEFAULT_BUCKET_MB = 25.0
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class PredictConfig:
    """What `perflab scale --predict` assumes beyond what it measured; one option per field."""

    predict: Optional[str] = option("--predict", str, "GPU counts to predict step time and efficiency at, from the "
                                    "1-GPU point's step breakdown and the links' bandwidth (e.g. 2,8,64,512; "
                                    "--gpus-per-node to a node)", PREDICT, metavar="N[,N...]", commands=SCALE,
                                    sweepable=False)
    gpus_per_node: int = option("--gpus-per-node", int, "GPUs in one node for --predict (default: 8)", PREDICT, 8,
                                minimum=1, metavar="N", commands=SCALE, sweepable=False)
    intra_node_gbps: Optional[float] = option("--intra-node-gbps", float, "bus bandwidth between a node's GPUs in "
                                              "GB/s (default: measured by `perflab calibrate --collectives`, else "
                                              "the GPU's nominal link)", PREDICT, above=0, metavar="GB/s",
                                              commands=SCALE, sweepable=False)
    inter_node_gbits: float = option("--inter-node-gbps", float, "stated bandwidth between nodes per GPU, in Gb/s "
                                     "(default: 400, one InfiniBand NDR port per GPU)", PREDICT, 400.0, above=0,
                                     metavar="Gb/s", commands=SCALE, sweepable=False)
    inter_node_latency_us: float = option("--inter-node-latency-us", float, "stated latency a collective adds per "
                                          "level of a tree across nodes (default: 10)", PREDICT, 10.0, minimum=0,
                                          metavar="US", commands=SCALE, sweepable=False)

    def counts(self) -> list[int]:
        """--predict 2,8,64 -> [2, 8, 64]; a count above one node must fill whole nodes."""
        try:
            counts = sorted({int(part) for part in str(self.predict).split(",") if part.strip()})
        except ValueError:
            raise PerflabError(f"--predict {self.predict}: give GPU counts like 2,8,64,512") from None
        if not counts or counts[0] < 1:
            raise PerflabError(f"--predict {self.predict}: GPU counts must be positive integers, like 2,8,64")
        for count in counts:
            if count > self.gpus_per_node and count % self.gpus_per_node:
                raise PerflabError(f"--predict {count}: more GPUs than one node (--gpus-per-node "
                                   f"{self.gpus_per_node}) must fill whole nodes; use a multiple of it")
        return counts


@dataclass(frozen=True)
class Link:
    """One kind of link: bus bandwidth (GB/s), latency per collective (s), and where each figure came from."""

    busbw_gbps: float
    latency_s: float
    source: str


@dataclass(frozen=True)
class Interconnect:
    """Within a node (measured or nominal) and between nodes (stated)."""

    intra: Link
    inter: Link
    gpus_per_node: int

    def layout(self, gpus: int) -> tuple[int, int]:
        """(GPUs per node, nodes) for a total GPU count."""
        if gpus <= self.gpus_per_node:
            return gpus, 1
        return self.gpus_per_node, gpus // self.gpus_per_node

    def link_for(self, gpus: int) -> Link:
        """The ring's link at this many GPUs: the node's own, or across nodes the slower bandwidth and the latency
        of a tree over the nodes added."""
        _, nodes = self.layout(gpus)
        if nodes == 1:
            return self.intra
        levels = math.ceil(math.log2(nodes))
        return Link(min(self.intra.busbw_gbps, self.inter.busbw_gbps),
                    self.intra.latency_s + levels * self.inter.latency_s, "across nodes")


@dataclass(frozen=True)
class StepBreakdown:
    """A one-GPU training step (ms) and what its parameters weigh."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    other_ms: float  # data wait, copies, the rest of the step
    parameters: int
    units: int = 1  # FSDP units: the blocks sharded on their own

    @property
    def step_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.optimizer_ms + self.other_ms


@dataclass(frozen=True)
class Recipe:
    """The data-parallel settings the model needs: DDP's bucket and gradient dtype; FSDP's dtypes and resharding."""

    parallel: str = "ddp"
    bucket_mb: float = DDP_DEFAULT_BUCKET_MB
    gradient_dtype: str = "fp32"  # DDP: bf16 with the compression hook
    param_dtype: str = "fp32"  # FSDP all-gather
    reduce_dtype: str = "fp32"  # FSDP reduce-scatter
    kept_units: int = 0  # FSDP units that keep their parameters from forward to backward (all: no reshard)


@dataclass
class Prediction:
    """The model at one GPU count (a row of scale.json's predictions)."""

    gpus: int
    gpus_per_node: int
    nodes: int
    parallel: str
    step_ms: float
    communication_ms: float
    exposed_ms: float
    efficiency_pct: float
    busbw_gbps: float
    detail: dict[str, float] = field(default_factory=dict)
    overlap_tax_ms: float = 0.0  # the compute's slowdown under the overlapped communication, in step_ms
    efficiency_without_tax_pct: float = 100.0  # exposed communication alone, as the model had it before the tax
    overlap_tax: str = NO_TAX.source  # where the tax came from
    recipe: Optional[Recipe] = None  # the data-parallel settings predicted (predict_rows)
    measured_efficiency_pct: Optional[float] = None  # the scale run's trusted efficiency at this count, if measured

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Prediction":
        """A row of scale.json's predictions, from any perflab version: missing keys take their defaults (an old
        file's tax is none), unknown keys are dropped."""
        known = {item.name for item in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        values.setdefault("efficiency_without_tax_pct", values.get("efficiency_pct", 100.0))
        recipe = values.pop("recipe", None)
        if isinstance(recipe, dict):
            settings = {item.name for item in fields(Recipe)}
            recipe = Recipe(**{name: value for name, value in recipe.items() if name in settings})
        return cls(**values, recipe=recipe)


def ddp_exposed_s(gradient_bytes: float, bucket_bytes: float, backward_s: float, link: Link, gpus: int
                  ) -> tuple[float, float, int]:
    """(exposed s, communication s, buckets) of DDP's bucketed all-reduce overlapped with backward."""
    buckets = max(1, math.ceil(gradient_bytes / bucket_bytes))
    per_bucket = collective_seconds("all_reduce", gradient_bytes / buckets, link.busbw_gbps, link.latency_s, gpus)
    exposed = max(per_bucket, buckets * per_bucket - backward_s * (buckets - 1) / buckets)
    return exposed, buckets * per_bucket, buckets


def fsdp_exposed_s(step: StepBreakdown, recipe: Recipe, link: Link, gpus: int) -> tuple[float, float, dict]:
    """(exposed s, communication s, detail) of FSDP2's per-unit all-gathers and reduce-scatters with prefetch."""
    units = max(1, step.units)
    per_unit = step.parameters / units
    gather = collective_seconds("all_gather", per_unit * BYTES[recipe.param_dtype], link.busbw_gbps, link.latency_s,
                                gpus)
    scatter = collective_seconds("reduce_scatter", per_unit * BYTES[recipe.reduce_dtype], link.busbw_gbps,
                                 link.latency_s, gpus)
    forward_unit, backward_unit = step.forward_ms / 1e3 / units, step.backward_ms / 1e3 / units
    kept = min(recipe.kept_units, units)
    exposed_forward = gather + (units - 1) * max(0.0, gather - forward_unit)
    first = gather if kept == 0 else 0.0  # backward starts with the last unit: kept, or gathered again
    regather = max(0, units - max(kept, 1))  # the other units that gather again in backward
    exposed_backward = (first + regather * max(0.0, gather + scatter - backward_unit)
                        + (units - 1 - regather) * max(0.0, scatter - backward_unit) + scatter)
    communication = units * gather + (units - kept) * gather + units * scatter
    return exposed_forward + exposed_backward, communication, {
        "all_gather_ms": 1e3 * gather, "reduce_scatter_ms": 1e3 * scatter,
        "exposed_forward_ms": 1e3 * exposed_forward, "exposed_backward_ms": 1e3 * exposed_backward}


def predict(step: StepBreakdown, recipe: Recipe, network: Interconnect, gpus: int, tax: OverlapTax = NO_TAX
            ) -> Prediction:
    """Step time and efficiency at `gpus` GPUs (1 GPU: the measured step, no communication), with the overlap tax."""
    per_node, nodes = network.layout(gpus)
    link = network.link_for(gpus)
    if gpus == 1:
        exposed_s = communication_s = 0.0
        detail: dict[str, float] = {}
    elif recipe.parallel == "fsdp":
        exposed_s, communication_s, detail = fsdp_exposed_s(step, recipe, link, gpus)
    else:
        gradient_bytes = step.parameters * BYTES[recipe.gradient_dtype]
        exposed_s, communication_s, buckets = ddp_exposed_s(gradient_bytes, recipe.bucket_mb * 2**20,
                                                             step.backward_ms / 1e3, link, gpus)
        detail = {"buckets": buckets}
    tax_ms = tax.ms_at(gpus, 1e3 * (communication_s - exposed_s))
    untaxed_ms = step.step_ms + 1e3 * exposed_s
    step_ms = untaxed_ms + tax_ms  # every term >= 0: the efficiency stays within (0, 100]
    return Prediction(gpus=gpus, gpus_per_node=per_node, nodes=nodes, parallel=recipe.parallel, step_ms=step_ms,
                      communication_ms=1e3 * communication_s, exposed_ms=1e3 * exposed_s,
                      efficiency_pct=100 * step.step_ms / step_ms, busbw_gbps=link.busbw_gbps, detail=detail,
                      overlap_tax_ms=tax_ms, efficiency_without_tax_pct=100 * step.step_ms / untaxed_ms,
                      overlap_tax=tax.source)


def overlap_tax_of(step: StepBreakdown, recipe: Recipe, network: Interconnect, measured: dict[int, Optional[float]],
                   measured_exposed: dict[int, Optional[float]], below: Optional[int] = None,
                   uncertainty: Optional[dict[int, Optional[float]]] = None) -> OverlapTax:
    """The tax fitted from the multi-GPU counts with a measured efficiency (below `below` GPUs, where given: a
    prediction at a measured count is then a check, not a fit of itself). `measured`: GPUs -> efficiency %;
    `measured_exposed`: GPUs -> profiled exposed ms, where the point has it; `uncertainty`: GPUs -> the throughput's
    95% half-interval as a share of it, where known."""
    points = []
    for gpus in sorted(gpus for gpus, efficiency in measured.items() if gpus > 1 and efficiency):
        if below is not None and gpus >= below:
            continue
        untaxed = predict(step, recipe, network, gpus)
        points.append(tax_point(step.step_ms, gpus, measured[gpus], untaxed.communication_ms, untaxed.exposed_ms,
                                measured_exposed.get(gpus), (uncertainty or {}).get(gpus)))
    return fit_overlap_tax(points)


# ---------------------------------------------------------------------------------------------- from a scale run

NOMINAL_INTRA_LATENCY_US = 10.0  # stated with the nominal link where no collectives were measured


def breakdown_of(result) -> StepBreakdown:
    """The one-GPU step of a training result: its phases (ms), parameters and blocks (the FSDP units)."""
    if result.config.mode != "train":
        raise PerflabError("--predict models a training step (gradients to all-reduce): use --mode train")
    phases = dict(result.metrics.phases_ms)
    main = {name: phases.pop(name, 0.0) for name in ("forward", "backward", "optimizer")}
    info = (result.workload or {}).get("info") or {}
    return StepBreakdown(forward_ms=main["forward"], backward_ms=main["backward"], optimizer_ms=main["optimizer"],
                         other_ms=sum(phases.values()), parameters=int(result.workload["parameters"]),
                         units=int(info.get("layers") or 1))


def recipe_of(config: RunConfig, units: int) -> Recipe:
    """The data-parallel settings of a run's config."""
    kept = units if config.reshard_after_forward is False else int(config.fsdp_no_reshard_last or 0)
    return Recipe(parallel=config.parallel or "ddp", bucket_mb=config.ddp_bucket_mb or DDP_DEFAULT_BUCKET_MB,
                  gradient_dtype="bf16" if config.ddp_comm_hook else "fp32",
                  param_dtype=config.fsdp_param_dtype or "fp32", reduce_dtype=config.fsdp_reduce_dtype or "fp32",
                  kept_units=kept)


def interconnect(settings: PredictConfig, measured: Optional[CollectivesCalibration],
                 nominal: Optional[PeerLink]) -> Interconnect:
    """The links: within a node --intra-node-gbps, else measured collectives, else the nominal link; between
    nodes the stated figures."""
    latency_s, latency_source = NOMINAL_INTRA_LATENCY_US * 1e-6, f"stated {NOMINAL_INTRA_LATENCY_US:g} µs"
    if measured:
        latency_us = measured.latency_us["all_reduce"]
        latency_s, latency_source = latency_us * 1e-6, f"measured {latency_us:.1f} µs"
    if settings.intra_node_gbps is not None:
        intra = Link(settings.intra_node_gbps, latency_s, f"given --intra-node-gbps {settings.intra_node_gbps:g} GB/s "
                                                          f"bus bandwidth, latency {latency_source}")
    elif measured:
        busbw = measured.peak_busbw_gbps["all_reduce"]
        intra = Link(busbw, latency_s, f"measured by perflab calibrate --collectives over {measured.ranks} ranks "
                                       f"({measured.measured_utc}): all-reduce bus bandwidth {busbw:.1f} GB/s, "
                                       f"latency {latency_source}")
    elif nominal:
        intra = Link(nominal.gbps, latency_s, f"stated: nominal {nominal.name} {nominal.gbps:g} GB/s as "
                                              f"bus bandwidth (not measured: run perflab calibrate "
                                              f"--collectives), latency {latency_source}")
    else:
        raise PerflabError("--predict needs the bus bandwidth between this node's devices: run `perflab calibrate "
                           "--collectives --nproc 2` once, or give --intra-node-gbps")
    inter = Link(settings.inter_node_gbits / 8, settings.inter_node_latency_us * 1e-6,
                 f"stated: {settings.inter_node_gbits:g} Gb/s per GPU ({settings.inter_node_gbits / 8:g} GB/s), "
                 f"{settings.inter_node_latency_us:g} µs per tree level across nodes")
    return Interconnect(intra=intra, inter=inter, gpus_per_node=settings.gpus_per_node)


def predict_rows(rows: list[ScaleRow], single_results: dict[str, Any], network: Interconnect, counts: list[int],
                 group_of: Callable[[ScaleRow], str],
                 exposed_of: Optional[Callable[[ScaleRow], Optional[float]]] = None) -> list[Prediction]:
    """For every data-parallel recipe of the scale run (DDP and FSDP2 at their defaults where only one GPU ran), the
    prediction at each count and at each measured count, beside the measured efficiency where the run has that
    point, with the overlap tax fitted from its multi-GPU points below each count. `single_results`: group key -> the 1-GPU
    Result; `group_of(row)`: a row's group key; `exposed_of(row)`: a point's profiled exposed ms, or None."""
    out = []
    for group, single in single_results.items():
        configs = {recipe_settings(row.config): row.config for row in rows
                   if group_of(row) == group and row.config.nproc > 1}
        if not configs:  # one GPU only: both wrappers at their defaults
            configs = {(kind,): RunConfig(parallel=kind) for kind in ("ddp", "fsdp")}
        step = breakdown_of(single)
        for key, config in configs.items():
            recipe = recipe_of(config, step.units)
            points = [row for row in rows if group_of(row) == group and row.ok and row.config.nproc > 1
                      and recipe_settings(row.config) == key]
            measured = {row.world_size: row.efficiency_pct for row in points}
            exposed = {row.world_size: exposed_of(row) for row in points} if exposed_of else {}
            uncertainty = {row.world_size: row.throughput_uncertainty for row in points}
            for gpus in sorted(set(counts) | set(measured)):
                tax = overlap_tax_of(step, recipe, network, measured, exposed, below=gpus, uncertainty=uncertainty)
                prediction = predict(step, recipe, network, gpus, tax)
                out.append(replace(prediction, recipe=recipe, measured_efficiency_pct=measured.get(gpus)))
    return out


RECIPE_FIELDS = ("parallel", "ddp_bucket_mb", "ddp_comm_hook", "fsdp_param_dtype", "fsdp_reduce_dtype",
                 "reshard_after_forward", "fsdp_no_reshard_last")


def recipe_settings(config: RunConfig) -> tuple[Any, ...]:
    """The config's settings that make a recipe: points with the same ones are one recipe at several counts."""
    return tuple(getattr(config, name) for name in RECIPE_FIELDS)

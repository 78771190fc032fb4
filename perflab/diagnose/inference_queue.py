"""Inference queue: in a `perflab serve` result, the tail is spent waiting in the queue, or batches go out
under-filled at a load the model could take in fuller batches. Reads the serve metrics; needs no trace."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from perflab.bottlenecks import INFERENCE_QUEUE
from perflab.diagnose.findings import Context, Finding, clamp, rounded
from perflab.levers import levers_for
from perflab.results.metrics import LoadPoint, Serve, ServeSettings

DOMINANT_SHARE_PCT = 50.0  # a part of the tail latency this large "dominates" it
UNDERFILLED_PCT = 50.0  # mean batch fill below this is under-filled
BUSY_PCT = 70.0  # an instance busier than this has little room left
FULL_PCT = 90.0  # batches this full are limited by --batcher-max-batch
OVERLOADED = 0.95  # achieved below this share of the realised offered rate: the server does not keep up
PADDED_PCT = 15.0  # padding past this share of the samples computed is worth fewer, finer buckets


def _focus_point(serve: Serve) -> Optional[LoadPoint]:
    """The server point to explain: the lowest offered load that misses the bound, else the highest load (points
    where the harness dispatched late measured the batcher, not the model's queue: they are left out)."""
    points = [p for p in serve.points if p.scenario == "server" and p.completed and not p.harness_late]
    if not points:
        return None
    missing = [p for p in points if not p.meets_bound]
    if missing:
        return min(missing, key=lambda p: p.offered_qps)
    return max(points, key=lambda p: p.offered_qps)


def _offered(point: LoadPoint) -> float:
    """The rate the point's schedule really offered (a seeded Poisson draw is a little off its nominal rate: read
    against the nominal one, that noise would look like queries the server failed to admit)."""
    return point.offered


def _shares(point: LoadPoint) -> dict[str, float]:
    tail = point.time_ms["tail"]
    total = sum(tail.values())
    return {name: 100 * value / total for name, value in tail.items()} if total > 0 else {}


def inference_queue(ctx: Context) -> Optional[Finding]:
    serve = ctx.metrics.serve
    if serve is None:
        return None
    point = _focus_point(serve)
    if point is None:
        return None
    settings = serve.settings
    shares = _shares(point)
    queue_share = shares.get("queue_wait", 0.0)
    formation_share = shares.get("batch_formation", 0.0)
    fill, busy = point.batch_fill_pct, point.instance_busy_pct
    offered, achieved = _offered(point), point.achieved_qps
    ceiling = serve.estimated_samples_per_s or 0.0
    p99, bound = point.p99_ms, settings.p99_ms
    tail = point.time_ms["tail"]
    evidence = {"offered_qps": point.offered_qps, "realised_offered_qps": point.realised_offered_qps,
                "achieved_qps": achieved, "p99_ms": p99, "p99_bound_ms": bound,
                "tail_queue_wait_ms": tail.get("queue_wait"), "tail_queue_wait_pct": queue_share,
                "tail_batch_formation_pct": formation_share,
                "tail_dispatch_delay_ms": tail.get("dispatch_delay"), "batch_fill_pct": fill,
                "mean_batch": point.batch_mean, "max_batch": settings.max_batch, "instance_busy_pct": busy,
                "full_batch_samples_per_s": ceiling, "max_qps": serve.max_qps}
    gpu_util = _gpu_util_pct(point)
    if gpu_util is not None:
        evidence["gpu_util_pct"] = gpu_util
    advice = _advice(point, settings, serve, gpu_util, offered, achieved, ceiling)
    gain = (queue_share, "share of the p99 tail latency spent waiting for a free instance")
    if queue_share >= DOMINANT_SHARE_PCT:
        summary = (f"queue wait is {queue_share:.0f}% of the tail (p99 {p99:.1f} ms at {offered:,.0f} queries/s "
                   f"offered, {achieved:,.0f} achieved): queries wait for a free instance; batches are "
                   f"{fill:.0f}% full and the instances {busy:.0f}% busy")
        confidence = clamp(0.35 + queue_share / 100 * 0.6)
    elif fill < UNDERFILLED_PCT and busy >= BUSY_PCT and ceiling > offered and p99 > bound:
        summary = (f"batches are under-filled ({point.batch_mean:.1f} of {settings.max_batch}, {fill:.0f}%) "
                   f"while the instances are {busy:.0f}% busy: at {offered:,.0f} queries/s each small batch pays the "
                   f"full per-batch cost, though full batches run {ceiling:,.0f} samples/s")
        confidence = clamp(0.4 + (UNDERFILLED_PCT - fill) / 100 + (busy - BUSY_PCT) / 100)
        gain = (queue_share + formation_share, "share of the p99 tail latency spent queueing and forming batches")
    elif formation_share >= DOMINANT_SHARE_PCT and p99 > bound:
        summary = (f"batch formation is {formation_share:.0f}% of the tail: queries wait up to --batch-timeout-ms "
                   f"{settings.batch_timeout_ms:g} for batches to fill, past the p99 bound of {bound:g} ms")
        confidence = clamp(0.3 + formation_share / 100 * 0.6)
        gain = (formation_share, "share of the p99 tail latency spent forming batches")
    else:
        return None
    return Finding(cls=INFERENCE_QUEUE, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=ctx.rank_levers(levers_for(INFERENCE_QUEUE)) if busy >= BUSY_PCT else [], advice=advice,
                   expected_gain_pct=gain[0], gain_basis=gain[1])


@dataclass(frozen=True)
class SettingChange:
    """One change to the serve settings the rule proposes: a ServeConfig field, its new value, and why (one line
    that also names the flag, as the advice shows it). `perflab tune --objective max-qps` tries these."""

    option: str
    value: Any
    why: str


def setting_changes(serve: Serve) -> list[SettingChange]:
    """The batching policy, instance count and bucket step the serve record's focus point calls for."""
    point = _focus_point(serve)
    if point is None:
        return []
    return _setting_changes(point, serve.settings, _gpu_util_pct(point))


def _gpu_util_pct(point: LoadPoint) -> Optional[float]:
    return (point.gpu or {}).get("util_mean_pct")


def _setting_changes(point: LoadPoint, settings: ServeSettings, gpu_util: Optional[float]) -> list[SettingChange]:
    changes = []
    fill, busy, offered = point.batch_fill_pct, point.instance_busy_pct, _offered(point)
    max_batch, timeout_ms, bound = settings.max_batch, settings.batch_timeout_ms, settings.p99_ms
    if fill >= FULL_PCT:
        changes.append(SettingChange("max_batch", 2 * max_batch, f"batches are {fill:.0f}% full: raise --batcher-max-batch "
                                     f"above {max_batch} (e.g. {2 * max_batch})"))
    elif fill < UNDERFILLED_PCT and busy >= BUSY_PCT:
        # Long enough to gather half a batch at this rate, but well inside the latency bound.
        wait_ms = round(min(1000 * (max_batch / 2) / max(offered, 1e-9), bound / 3), 1)
        if wait_ms > timeout_ms:
            changes.append(SettingChange("batch_timeout_ms", wait_ms, f"batches average {point.batch_mean:.1f} of "
                                         f"{max_batch}: raise --batch-timeout-ms from {timeout_ms:g} to about "
                                         f"{wait_ms:.1f} so batches fill"))
    if point.time_ms["tail"].get("batch_formation", 0.0) > bound / 2 and timeout_ms > 0:
        changes.append(SettingChange("batch_timeout_ms", round(timeout_ms / 2, 2), f"lower --batch-timeout-ms "
                                     f"(now {timeout_ms:g}, e.g. {timeout_ms / 2:g}): forming a batch takes half the "
                                     "p99 bound"))
    if busy >= BUSY_PCT and (gpu_util is None or gpu_util < 80.0):
        util = "" if gpu_util is None else f" while the GPU is {gpu_util:.0f}% utilised"
        changes.append(SettingChange("instances", settings.instances + 1, f"--instances {settings.instances + 1}"
                                     f": the instances are {busy:.0f}% busy{util}; another instance overlaps copies "
                                     "and launches with compute"))
    padded, served = point.padded_samples or 0, point.completed or 0
    step = settings.bucket_step
    if padded and 100 * padded / (padded + served) >= PADDED_PCT and settings.buckets:
        now = f" (now {step})" if step else ""
        changes.append(SettingChange("bucket_step", max(1, (step or 2) // 2),
                                     f"{100 * padded / (padded + served):.0f}% of the samples computed were padding "
                                     f"(batches run at the next of {settings.buckets}): a lower --bucket-step{now} "
                                     "pads less, at the cost of more shapes to compile or capture in warm-up"))
    return changes


def _advice(point, settings, serve, gpu_util, offered, achieved, ceiling) -> list[str]:
    """Batching policy, instances and bucket step (setting changes), and admission control, each with the number
    that calls for it."""
    advice = [change.why for change in _setting_changes(point, settings, gpu_util)]
    if offered and achieved < OVERLOADED * offered:
        cap = serve.max_qps
        limit = f" (admit at most {cap:,.0f} queries/s, the max QPS that met the bound)" if cap else ""
        advice.append(f"admission control: {offered:,.0f} queries/s were offered (the schedule's realised rate) but "
                      f"only {achieved:,.0f}/s were "
                      f"served; reject or shed queries past the sustainable rate{limit} instead of queueing them")
    if ceiling and offered > ceiling:
        advice.append(f"the offered load exceeds full-batch throughput ({ceiling:,.0f} samples/s): more GPUs or a "
                      "faster model (levers) are needed, not batching")
    return advice

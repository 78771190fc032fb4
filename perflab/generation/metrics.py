"""Request timing (TTFT, TPOT, inter-token latency, goodput) and the memory-bandwidth bound of a decode step.

The TokenClock records, per request batch, when it started and when each group of tokens came out: CUDA events
on the current stream (read after the trial's final synchronize) or the host clock on a CPU. Nothing in it
synchronises. The figures follow vLLM's `bench serve`: TTFT = first token - start; TPOT = (last - first) /
(tokens - 1); ITL = gaps between outputs, per token (a speculative step emitting k tokens counts k gaps of a
k-th of its time); goodput = requests per second that meet every SLO.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from perflab.calibrate import percent_of_ceiling
from perflab.stats import percentiles


@dataclass
class RequestTiming:
    """One request batch: its shape and when its tokens came out (ms from its start)."""

    batch: int
    prompt_len: int
    emitted_ms: list[float]
    counts: list[int]
    issued_ms: Optional[list[float]] = None  # when the host had issued each output's work (ms from its start)
    # when the device began each decode step (ms from its start; one per output after the first): the device's
    # idle time between a step's output and the next step's start is time it waited for the host
    started_ms: Optional[list[float]] = None

    @property
    def output_tokens(self) -> int:
        return sum(self.counts)

    @property
    def ttft_ms(self) -> float:
        return self.emitted_ms[0]

    @property
    def tpot_ms(self) -> Optional[float]:
        later = self.output_tokens - self.counts[0]
        return (self.emitted_ms[-1] - self.emitted_ms[0]) / later if later else None

    @property
    def inter_token_ms(self) -> list[float]:
        gaps = []
        for (before, after), count in zip(zip(self.emitted_ms, self.emitted_ms[1:]), self.counts[1:]):
            gaps += [(after - before) / count] * count
        return gaps


@dataclass
class RequestMarks:
    """One request's marks as the TokenClock records them (CUDA events, or host-clock seconds on a CPU)."""

    start: Any
    batch: int
    prompt_len: int
    host_start: float
    outputs: list[Any] = field(default_factory=list)  # one mark per group of tokens out
    counts: list[int] = field(default_factory=list)  # tokens in each group
    issued: list[float] = field(default_factory=list)  # host clock when each group's work had been issued
    step_starts: list[Any] = field(default_factory=list)  # one mark per decode step, before it is issued


class TokenClock:
    """Marks request starts and token outputs without synchronising; read after the device is synchronised."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.requests: list[RequestMarks] = []

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self, batch: int, prompt_len: int) -> None:
        self.requests.append(RequestMarks(self._now(), batch, prompt_len, time.perf_counter()))

    def step_begins(self) -> None:
        """A decode step is about to be issued (after the first output): marks where the device starts it."""
        self.requests[-1].step_starts.append(self._now())

    def emit(self, count: int) -> None:
        request = self.requests[-1]
        request.outputs.append(self._now())
        request.counts.append(count)
        request.issued.append(time.perf_counter())  # the host's own clock: how fast it issues the steps

    def clear(self) -> None:
        self.requests.clear()

    def _ms(self, start: Any, mark: Any) -> float:
        return start.elapsed_time(mark) if self.cuda else (mark - start) * 1e3

    def timings(self) -> list[RequestTiming]:
        """Every request recorded since the last clear (call after synchronising the device)."""
        return [RequestTiming(r.batch, r.prompt_len, [self._ms(r.start, mark) for mark in r.outputs], list(r.counts),
                              [(at - r.host_start) * 1e3 for at in r.issued],
                              [self._ms(r.start, mark) for mark in r.step_starts] or None)
                for r in self.requests if r.outputs]


# ---------------------------------------------------------------------------------------------- SLOs


def chosen_levers(cfg: Any) -> dict[str, Any]:
    """What the generation levers were set to in this run (result.metrics.generation.levers)."""
    return {"kv_cache": cfg.kv_cache, "compile": cfg.compile, "quantize": cfg.quantize, "speculative": cfg.speculative}


def meets_slo(request: RequestTiming, slo: dict[str, float]) -> bool:
    if "ttft" in slo and request.ttft_ms > slo["ttft"]:
        return False
    tpot = request.tpot_ms
    return not ("tpot" in slo and tpot is not None and tpot > slo["tpot"])


# ---------------------------------------------------------------------------------------------- the bound

@dataclass
class BandwidthBound:
    """What one decode step must read, and how fast the device can read it."""

    weight_bytes: int  # weights one step reads, at their stored dtype (quantized weights at their packed size)
    kv_bytes_per_position: int  # keys + values of one position, every layer, the whole batch
    memory_gbps: Optional[float]
    source: str
    notes: list[str] = field(default_factory=list)
    matmul_flops_per_step: float = 0.0  # 2 x weights x batch: the compute floor's side of the roofline
    peak_tflops: Optional[float] = None

    def step_bytes(self, cached_positions: int) -> int:
        return self.weight_bytes + self.kv_bytes_per_position * cached_positions

    def decode_bound_ms(self, request: RequestTiming) -> Optional[float]:
        """The fastest possible time for this request's decode steps (every output after the first)."""
        if not self.memory_gbps:
            return None
        steps = request.output_tokens - 1
        # decode step i (1-based) attends to the prompt and i output tokens: prompt_len + i positions
        positions = steps * request.prompt_len + steps * (steps + 1) / 2
        total = steps * self.weight_bytes + self.kv_bytes_per_position * positions
        return total / (self.memory_gbps * 1e9) * 1e3


def summarize_requests(requests: list[RequestTiming], trial_walls: list[tuple[int, float]],
                       bound: Optional[BandwidthBound], slo: dict[str, float]) -> dict[str, Any]:
    """The generation metrics of a run: latencies, throughputs, the bandwidth bound and goodput.

    `trial_walls` holds (request batches, wall seconds) per trial, in order: throughputs are per trial, then
    the median over trials.
    """
    ttft = [r.ttft_ms for r in requests]
    tpot = [r.tpot_ms for r in requests if r.tpot_ms is not None]
    itl = [gap for r in requests for gap in r.inter_token_ms]
    e2e = [r.emitted_ms[-1] for r in requests]
    out: dict[str, Any] = {
        "requests": sum(r.batch for r in requests), "request_batches": len(requests),
        "output_tokens": sum(r.output_tokens * r.batch for r in requests),
        "ttft_ms": _distribution(ttft), "tpot_ms": _distribution(tpot), "itl_ms": _distribution(itl),
        "e2e_latency_ms": _distribution(e2e),
        "output_tokens_per_s": _per_trial(requests, trial_walls, lambda r: r.output_tokens * r.batch),
        "requests_per_s": _per_trial(requests, trial_walls, lambda r: r.batch),
        "prompt_len_mean": float(np.mean([r.prompt_len for r in requests])),
        "output_len_mean": float(np.mean([r.output_tokens for r in requests])),
    }
    out["bandwidth_bound"] = _bound_summary(requests, bound) if bound is not None else None
    if slo:
        meeting = [r for r in requests if meets_slo(r, slo)]
        share = sum(r.batch for r in meeting) / out["requests"]
        out["goodput"] = {"slo_ms": slo, "requests_meeting_slo_pct": 100 * share,
                          "goodput_requests_per_s": share * out["requests_per_s"]}
    return out


def _distribution(values: list[float]) -> Optional[dict[str, float]]:
    if not values:
        return None
    found = percentiles(values)
    found.update(mean=float(np.mean(values)), min=float(np.min(values)), max=float(np.max(values)))
    return found


def _per_trial(requests: list[RequestTiming], trial_walls: list[tuple[int, float]], amount) -> float:
    rates, start = [], 0
    for count, wall_s in trial_walls:
        chunk = requests[start:start + count]
        start += count
        if chunk and wall_s > 0:
            rates.append(sum(amount(r) for r in chunk) / wall_s)
    return float(np.median(rates)) if rates else 0.0


def _bound_summary(requests: list[RequestTiming], bound: BandwidthBound) -> dict[str, Any]:
    decoding = [r for r in requests if r.output_tokens > 1]
    summary: dict[str, Any] = {
        "weight_bytes": bound.weight_bytes, "kv_bytes_per_position": bound.kv_bytes_per_position,
        "memory_gbps": bound.memory_gbps, "memory_gbps_source": bound.source, "notes": list(bound.notes),
        "bound_ms_per_token": None, "measured_ms_per_token": None, "measured_over_bound": None, "pct_of_bound": None,
        "host_issue_ms_per_token": None, "device_wait_ms_per_token": None,
        "compute_ms_per_token": (bound.matmul_flops_per_step / (bound.peak_tflops * 1e12) * 1e3
                                 if bound.peak_tflops else None),
    }
    if not decoding or not bound.memory_gbps:
        return summary
    bound_ms = sum(bound.decode_bound_ms(r) for r in decoding)
    measured_ms = sum(r.emitted_ms[-1] - r.emitted_ms[0] for r in decoding)
    tokens = sum(r.output_tokens - 1 for r in decoding)
    issued = [r for r in decoding if r.issued_ms]
    summary["host_issue_ms_per_token"] = (sum(r.issued_ms[-1] - r.issued_ms[0] for r in issued) /
                                          sum(r.output_tokens - 1 for r in issued) if issued else None)
    summary["device_wait_ms_per_token"] = device_wait_ms_per_token(decoding)
    # the share of the bandwidth bound is the bound's time over the measured time: the bound is the ceiling
    pct, over = percent_of_ceiling(bound_ms, measured_ms, "the decode steps' share of the memory-bandwidth bound")
    summary.update(bound_ms_per_token=bound_ms / tokens, measured_ms_per_token=measured_ms / tokens,
                   measured_over_bound=measured_ms / bound_ms if bound_ms else None, pct_of_bound=pct,
                   achieved_gbps=_achieved_gbps(decoding, bound, measured_ms))
    if over:
        summary["notes"].append(over)
    return summary


def device_wait_ms_per_token(requests: list[RequestTiming]) -> Optional[float]:
    """Per decoded token, how long the device sat idle between a step's output and the next step's start: waiting
    for the host to issue it (None without step starts). Unlike the host's own issue clock, this does not rise when
    the host runs ahead and waits for room in the launch queue."""
    timed = [r for r in requests if r.started_ms and len(r.started_ms) == len(r.emitted_ms) - 1]
    if not timed:
        return None
    idle = sum(max(0.0, start - emitted) for r in timed for start, emitted in zip(r.started_ms, r.emitted_ms))
    return idle / sum(r.output_tokens - r.counts[0] for r in timed)


def _achieved_gbps(decoding: list[RequestTiming], bound: BandwidthBound, measured_ms: float) -> Optional[float]:
    """Bytes the decode steps had to read ÷ the time they took."""
    if measured_ms <= 0:
        return None
    total = sum(bound.decode_bound_ms(r) for r in decoding) * bound.memory_gbps * 1e9 / 1e3
    return total / (measured_ms / 1e3) / 1e9


def stored_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor occupies as stored: a quantized tensor subclass (torchao) counts its packed inner tensors."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = flatten()
        return sum(stored_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def weight_bytes_per_step(model: torch.nn.Module, batch: int) -> int:
    """Bytes of weights one decode step reads: every parameter once, but of an embedding table only the rows
    looked up (`batch` of them), unless the same tensor is also a projection's weight (a tied output head).
    Buffers are left out: KV caches are counted by position, and masks and tables are not weights."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    projections = {id(m.weight) for m in model.modules() if not isinstance(m, torch.nn.Embedding)
                   and isinstance(getattr(m, "weight", None), torch.Tensor)}
    total = 0
    for tensor in model.parameters():  # shared parameters come once
        if id(tensor) in embeddings and id(tensor) not in projections:
            total += stored_bytes(tensor) * batch // tensor.shape[0]
        else:
            total += stored_bytes(tensor)
    return total

"""Generation under a serve load: one query is one request (a prompt and how many tokens to generate).

Static batching: the batcher's batch of requests is prefilled together and decoded to completion, and only then
does the instance take the next batch (continuous batching, where requests join and leave a running batch, is not
done). A batch takes the prompt length and output length of its first request, as `perflab run`'s request batches
do. The decode itself is the generation workload's own step (perflab/generation: its session, KV cache, compiled
decode, speculative decoding), timed per token by its TokenClock; the server turns those times into each query's
TTFT from its scheduled arrival, so the queue wait counts (perflab/serve/metrics.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from perflab.errors import PerflabError
from perflab.generation.metrics import RequestTiming, TokenClock
from perflab.step.plan import StepPlan
from perflab.serve.pool import BatchCopier, batch_buffer
from perflab.workloads import Workload


@dataclass
class RequestPool:
    """The loaded requests: prompts at the longest prompt length (pinned on a GPU) and each one's lengths."""

    prompts: torch.Tensor
    prompt_len: list[int]
    output_len: list[int]

    @property
    def count(self) -> int:
        return len(self.prompt_len)


def load_requests(workload: Workload, count: int, device: torch.device) -> RequestPool:
    """The first `count` requests of a generation workload's dataset."""
    items = [workload.dataset[index] for index in range(min(count, len(workload.dataset)))]
    prompts = torch.stack([tokens for tokens, _ in items])
    if device.type == "cuda":
        prompts = prompts.pin_memory()
    return RequestPool(prompts, [lengths[0] for _, lengths in items], [lengths[1] for _, lengths in items])


def check_generation_serving(workload: Workload, instances: int) -> None:
    """Refuse what a generation workload cannot serve, in one line."""
    if workload.generation.generate_fn is not None:
        raise PerflabError(f"{workload.name} times its own generation loop (generate_fn), which takes whole request "
                           "batches and returns when they are done: perflab serve batches requests through its own "
                           "decode loop, so build the workload without generate_fn to serve it")
    if instances > 1:
        raise PerflabError(f"{workload.name} generates with KV caches that live on the model itself, so it is served "
                           "by one instance: drop --instances")


HOST_PARTS = ("issue", "device_wait", "bookkeeping")


class GenerationEngine:
    """The one instance of a generation workload: copies a batch's prompts in, generates, copies the tokens out."""

    def __init__(self, plan: StepPlan, pool: RequestPool, max_batch: int,
                 on_results: Optional[Callable[[np.ndarray, torch.Tensor], None]] = None):
        self.plan = plan
        self.step = plan.custom_step  # the workload's GenerationStep: its session, caches, compiled decode
        self.pool = pool
        self.max_batch = max_batch
        self.on_results = on_results
        # A static KV cache holds exactly max_batch rows: batches are padded to it (padding rows repeat samples).
        self.sizes = [max_batch] if plan.generation.static_cache else None
        self.cuda = plan.device.type == "cuda"
        self.clock = TokenClock(plan.device)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        self.prompt_buffer = batch_buffer(pool.prompts, max_batch, plan.device)
        self.copier = BatchCopier([self.prompt_buffer], [pool.prompts])
        self.copier.copy(np.arange(max_batch) % pool.count, non_blocking=False)
        self.token_buffer = torch.empty(max_batch * max(pool.output_len), dtype=torch.long, pin_memory=self.cuda)
        self.last_request: Optional[RequestTiming] = None  # the token times of the batch just served
        self.padded_samples = 0
        # host seconds per part of serving a batch, summed since the last take_host_times(): issuing its work
        # (copy in, prefill, decode steps), waiting for the device to finish it, and reading its token times back
        self.host_s = dict.fromkeys(HOST_PARTS, 0.0)
        self.host_batches = 0

    def warm_up(self, rounds: int) -> None:
        """Every batch shape, `rounds` times (at least once): compiled decode steps are compiled here. Then a short
        request (two tokens) at every prompt length in the pool and batch shape: a prefill's first call at a new
        length costs more than the prefill itself (on a GPU, SDPA's cuDNN backend builds an execution plan per
        sequence length), and without this those first calls land inside the load, in the TTFT of whichever query
        first brings each length (on the H100 the engine's host time per batch fell 50 -> 35 -> 19 ms over three
        consecutive load points as fewer lengths were new)."""
        sizes = self.sizes or sorted({1, self.max_batch})
        for size in sizes:
            for _ in range(max(rounds, 1)):
                self.serve(np.arange(size) % self.pool.count)
        first_of_length: dict[int, int] = {}  # prompt length -> the first request of that length
        for index, length in enumerate(self.pool.prompt_len):
            first_of_length.setdefault(length, index)
        for size in sizes:
            for first in first_of_length.values():
                self._generate((first + np.arange(size)) % self.pool.count, new_tokens=2)
        if self.cuda:
            torch.cuda.synchronize(self.plan.device)
        self.padded_samples = 0
        self.take_host_times()

    def take_host_times(self) -> Optional[dict[str, float]]:
        """Mean host ms per batch in each part of serving it since the last call (None before any batch), and
        start counting again. A GPU busy well under 100% while the engine is always busy shows here."""
        taken = ({part: 1e3 * seconds / self.host_batches for part, seconds in self.host_s.items()}
                 if self.host_batches else None)
        self.host_s = dict.fromkeys(HOST_PARTS, 0.0)
        self.host_batches = 0
        return taken

    def _generate(self, sample_ids: np.ndarray, new_tokens: Optional[int] = None) -> torch.Tensor:
        """The batch's tokens: prompt length and output length of its first request (or `new_tokens`)."""
        count = len(sample_ids)
        size = count if self.sizes is None else self.max_batch
        self.padded_samples += size - count
        first = int(sample_ids[0])
        prompt_len = self.pool.prompt_len[first]
        new_tokens = new_tokens or self.pool.output_len[first]
        self.copier.copy(sample_ids, non_blocking=self.cuda)
        prompt = self.prompt_buffer[:size, :prompt_len].contiguous()
        self.clock.clear()
        tokens = self.step.generate(prompt, new_tokens, self.clock)
        return tokens[:count]

    def _copy_out(self, tokens: torch.Tensor) -> torch.Tensor:
        host = self.token_buffer[:tokens.numel()].view(tokens.shape)  # contiguous: one asynchronous copy
        return host.copy_(tokens, non_blocking=self.cuda)

    def serve(self, sample_ids: np.ndarray) -> tuple[float, float]:
        """Generate for one batch of requests; (seconds copying prompts in, seconds copying tokens out)."""
        if not self.cuda:
            began = time.perf_counter()
            tokens = self._generate(sample_ids)
            computed = time.perf_counter()
            host = self._copy_out(tokens)
            done = time.perf_counter()
            copy_in_s = (self.clock.requests[0].start - began) if self.clock.requests else 0.0
            copies = self._finish(sample_ids, host, copy_in_s, done - computed)
            self._count_host(done - began, 0.0, time.perf_counter() - done)  # a CPU computes as it issues
            return copies
        began, copied, computed, done = self.events
        host_began = time.perf_counter()
        began.record()
        tokens = self._generate(sample_ids)
        computed.record()
        host = self._copy_out(tokens)
        done.record()
        issued = time.perf_counter()
        done.synchronize()
        finished = time.perf_counter()
        start = self.clock.requests[0].start  # the TokenClock's event at the prefill's start: the copy ended there
        copies = self._finish(sample_ids, host, began.elapsed_time(start) / 1000, computed.elapsed_time(done) / 1000)
        self._count_host(issued - host_began, finished - issued, time.perf_counter() - finished)
        return copies

    def _count_host(self, *seconds: float) -> None:
        for part, spent in zip(HOST_PARTS, seconds):
            self.host_s[part] += spent
        self.host_batches += 1

    def _finish(self, sample_ids: np.ndarray, host: torch.Tensor, copy_in_s: float, copy_out_s: float
                ) -> tuple[float, float]:
        self.last_request = self.clock.timings()[0]
        if self.on_results is not None:
            self.on_results(sample_ids, host)
        return copy_in_s, copy_out_s


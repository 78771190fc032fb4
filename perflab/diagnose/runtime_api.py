"""The runtime API rule: allocator churn, and synchronous or pageable copies and memsets no other rule reports.

Read from the runtime API accounting (runtime_calls.py), in the words of Nsight Systems' expert rules
(cuda_api_sync, cuda_memcpy_sync, cuda_memset_sync, cuda_memcpy_async on pageable memory):
- allocator churn: cudaMalloc/cudaFree in every profiled step. cudaFree waits for the device, so the GPU idles
  like after a sync (class host-device sync); named by what made them: torch.cuda.empty_cache(), the allocator
  freeing its cache at its memory limit (a per-process memory fraction, a full GPU), or the op.
- synchronous copies and memsets: cudaMemcpy/cudaMemset without Async, and async copies from pageable memory
  (the driver stages them synchronously), outside the ops that also synchronize (sync.py reports those sites) and
  outside the input copies (copies.py reports those).
The blocking sync APIs themselves (cudaStreamSynchronize, ...) are sync.py's finding; their time is in the
accounting. Each finding's gain is the GPU idle from the calls' sites until the GPU is busy again.
"""
from __future__ import annotations

from typing import Optional

from perflab.bottlenecks import HOST_DEVICE_SYNC
from perflab.diagnose.findings import Context, Finding, clamp, gain, rounded
from perflab.diagnose.runtime_calls import (ALLOCATOR, ALLOCATOR_LIMIT, EMPTY_CACHE, PAGEABLE_COPY, SYNC_COPY,
                                            SYNC_MEMSET, ApiKind, RuntimeApiProfile)

GPU_IDLE_THRESHOLD_PCT = 3.0  # as sync.py: from here the idle is worth naming as the bottleneck
SECONDARY_MAX_CONFIDENCE = 0.45
EXPANDABLE = ("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow and shrink in place instead "
              "of being freed and allocated again")
ADVICE_BY_CAUSE = {
    EMPTY_CACHE: "remove torch.cuda.empty_cache() from the step: the caching allocator reuses its blocks, and "
                 "emptying it makes every step cudaFree them (which waits for the GPU) and cudaMalloc them again",
    ALLOCATOR_LIMIT: "the allocator runs at its limit: raise or drop torch.cuda.set_per_process_memory_fraction, "
                     "or lower the peak (smaller batch, activation checkpointing, lower precision)",
}
COPY_ADVICE = {
    SYNC_COPY: "synchronous cudaMemcpy blocks the host until the copy is done: use cudaMemcpyAsync on a stream",
    SYNC_MEMSET: "synchronous cudaMemset blocks the host: use cudaMemsetAsync on a stream",
    PAGEABLE_COPY: "an async copy from pageable memory runs synchronously (the driver drains the stream and "
                   "stages the bytes): make the tensor on the device (torch.tensor(..., device=...), a registered "
                   "buffer) or copy from pinned memory (tensor.pin_memory())",
}


def allocator_churn(ctx: Context) -> Optional[Finding]:
    """cudaMalloc/cudaFree in every profiled step, with the GPU idle they leave."""
    api = _accounting(ctx)
    calls = api.kinds.get(ALLOCATOR) if api is not None else None
    if calls is None or calls.steps_with_calls < api.steps:
        return None
    causes = api.allocator_causes_per_step
    named = [cause for cause in causes if cause in ADVICE_BY_CAUSE]
    cause = named[0] if named else next(iter(causes), "the allocator")
    summary = (f"{calls.calls_per_step:g} allocator calls per step ({_calls(calls)}), made by {cause}, in every "
               f"profiled step, left the GPU idle {calls.gpu_idle_pct:.0f}% of the time (cudaFree waits for the GPU)")
    evidence = {**_evidence(calls, "allocator"), "allocator_sites_by_cause_per_step": causes}
    advice = [ADVICE_BY_CAUSE[c] for c in named] + [EXPANDABLE]
    return _finding(calls, summary, evidence, advice,
                    basis="GPU idle from each allocator call's op until the first kernel after it returned")


def synchronous_copies(ctx: Context) -> Optional[Finding]:
    """Synchronous copies/memsets and pageable async copies that neither sync.py nor copies.py reports."""
    api = _accounting(ctx)
    calls = api.unclaimed if api is not None else None
    if calls is None:
        return None
    kinds = [kind for kind in (SYNC_COPY, SYNC_MEMSET, PAGEABLE_COPY) if kind in api.kinds and
             any(call in calls.by_call_per_step for call in api.kinds[kind].by_call_per_step)]
    summary = (f"{calls.calls_per_step:g} blocking copies or memsets per step ({_calls(calls)}; "
               f"{' and '.join(kinds)}), {_where(calls)}, left the GPU idle {calls.gpu_idle_pct:.0f}% of the time")
    return _finding(calls, summary, _evidence(calls, "blocking_copies"), [COPY_ADVICE[kind] for kind in kinds],
                    basis="GPU idle from each blocking copy's op until the first kernel after it returned")


RUNTIME_API_RULES = [allocator_churn, synchronous_copies]


def _accounting(ctx: Context) -> Optional[RuntimeApiProfile]:
    return ctx.profile.runtime_api if ctx.profile is not None else None


def _finding(calls: ApiKind, summary: str, evidence: dict, advice: list[str], basis: str) -> Finding:
    idle = calls.gpu_idle_pct
    if idle >= GPU_IDLE_THRESHOLD_PCT:
        confidence = clamp(0.5 + idle / 30)
    else:
        confidence = clamp(0.2 + idle / 60, high=SECONDARY_MAX_CONFIDENCE)
    return Finding(cls=HOST_DEVICE_SYNC, confidence=confidence, summary=summary, evidence=rounded(evidence),
                   levers=[], advice=advice, expected_gain_pct=gain(idle), gain_basis=basis)


def _evidence(calls: ApiKind, name: str) -> dict:
    return {f"{name}_calls_per_step": calls.calls_per_step, f"{name}_by_call_per_step": calls.by_call_per_step,
            f"{name}_ms_per_step": calls.ms_per_step, f"gpu_idle_after_{name}_pct": calls.gpu_idle_pct,
            f"{name}_by_caller_per_step": calls.by_caller_per_step}


def _calls(calls: ApiKind) -> str:
    """'6 cudaFree, 6 cudaMalloc'."""
    return ", ".join(f"{n:g} {call}" for call, n in calls.by_call_per_step.items())


def _where(calls: ApiKind) -> str:
    """'most in model.py(20): forward'."""
    callers = list(calls.by_caller_per_step)
    return f"{'in' if len(callers) == 1 else 'most in'} {callers[0]}" if callers else "outside any frame"

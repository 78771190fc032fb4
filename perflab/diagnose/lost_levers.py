"""What is left to say when a finding's levers were already tried on this run and lost (`tried_and_lost`).

A lever that lost is not proposed again; the finding says instead what its loss teaches: which part of the cost
the lever could not touch, and what acts on that part.
"""
from __future__ import annotations

from perflab.diagnose.findings import Context, Finding

# lever -> what its loss means, as advice (the cost it left in place, and what acts on that)
LEFT_WHEN_LOST = {
    "pin-memory": "pinning lost (pinning in the main process costs what the pageable copy cost): the copy itself is "
                  "the cost: copy uint8 (or the smallest dtype that holds the data) and convert on the GPU, or copy "
                  "less per step",
    "prefetcher-stream": "overlapping the copy with compute lost: the copy bandwidth is the limit: copy fewer bytes "
                         "(uint8, crops, decoded once on the GPU)",
    "workers": "more DataLoader workers lost: the per-item work itself is the cost: cache decoded/pre-processed "
               "items, or move the augmentation to the GPU in batches",
    "persistent-workers": "persistent workers lost: worker start-up is not the cost; the per-item work is: cache "
                          "decoded items or augment on the GPU",
    "prefetch-factor": "a deeper prefetch queue lost: the loader is slower than the step on average, not just "
                       "bursty: make each item cheaper (cache, GPU augmentation)",
    "augment-gpu": "GPU augmentation lost: precompute the augmented data, or lighten the transforms",
    "augment-gpu-stream": "GPU augmentation on a side stream lost: run it on the default stream, or precompute it",
    "cuda-graphs": "CUDA graphs lost: a larger batch amortises the per-op cost; fuse the small ops (torch.compile "
                   "default mode) or write them as fewer, larger tensor ops",
    "compile": "torch.compile lost: fuse by hand (fewer, larger tensor ops), or a larger batch",
    "fused-optimizer": "the fused optimizer lost: the optimizer step is not the cost",
    "foreach-optimizer": "the foreach optimizer lost: the optimizer step is not the cost",
    "bf16": "bf16 lost: the matmuls are not the limit at this size; a larger batch or less work is",
    "fp16": "fp16 lost: the matmuls are not the limit at this size; a larger batch or less work is",
    "tf32": "TF32 lost: the fp32 matmuls are not the limit; a larger batch or less work is",
    "channels-last": "channels-last lost: these convolutions are fastest in NCHW; keep it",
    "cudnn-benchmark": "cuDNN's timed algorithms lost: its heuristic choice is already the fastest here, or the "
                       "input shapes change between steps",
    "sdpa-flash": "flash attention lost: try the efficient backend, or a longer sequence per call",
    "activation-checkpointing": "checkpointing lost: a smaller batch with gradient accumulation, or lower precision",
}


def apply_tried_and_lost(ctx: Context, finding: Finding) -> Finding:
    """Drop the levers that lost from a finding's ranking and say what is left, first in its advice."""
    lost = [name for name in finding.levers if name in ctx.tried_and_lost]
    finding.levers = ctx.rank_levers(finding.levers)
    if lost:
        finding.evidence["tried_and_lost"] = lost
        left = [LEFT_WHEN_LOST.get(name, f"{name} lost: it does not address this cost") for name in lost]
        finding.advice = left + [advice for advice in finding.advice if advice not in left]
    return finding

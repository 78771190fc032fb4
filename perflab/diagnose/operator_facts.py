"""What is known about operators that are slow for what they do: the forward aten ops and backward nodes they show
up as in a trace, why they cost what they cost, what to do instead, and how much of their time the replacement
keeps (the basis of the expected gain). One table; perflab/diagnose/dominant_operator.py reads it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from perflab.bottlenecks import HOST_DEVICE_SYNC, MEMORY_BANDWIDTH

DETERMINISTIC_NOTE = ("torch.use_deterministic_algorithms(True) sends scatter/index ops down slower sorted or "
                      "serial paths: leave it off where bitwise reproducibility is not needed")


@dataclass(frozen=True)
class OperatorFact:
    """One family of operators: a regular expression over op names (forward `aten::...` ops and autograd backward
    nodes, lower case), what makes them slow, what to do, and the share of their time a realistic fix keeps."""

    name: str
    pattern: str
    known: str
    advice: tuple[str, ...]
    replacement: str  # what the fix runs instead, for the gain basis
    fix_keeps: float  # of the family's measured time, what the replacement still costs (0..1)
    cls: str = MEMORY_BANDWIDTH

    def matches(self, op: str) -> bool:
        return re.search(self.pattern, op.lower()) is not None


OPERATOR_FACTS: list[OperatorFact] = [
    OperatorFact(
        "bicubic interpolation", r"upsample_?bicubic",
        "bicubic interpolation reads 16 input pixels per output pixel; its backward scatters each output gradient "
        "back to those 16 pixels with atomic adds (on CUDA), far from the memory roof",
        ("upsample with mode='bilinear' or 'nearest', or a learned upsampler (ConvTranspose2d, or a conv followed "
         "by nn.PixelShuffle)",),
        "bilinear interpolation (4 taps instead of 16)", 0.3),
    OperatorFact(
        "bilinear/trilinear interpolation", r"upsample_?(bilinear|trilinear|linear1d)|_upsample_.*_aa",
        "linear interpolation's backward scatters each output gradient to its input pixels with atomic adds (on "
        "CUDA); the antialiased variants read many more taps",
        ("mode='nearest' followed by a conv, or a learned upsampler (nn.PixelShuffle after a conv); "
         "antialias=False where the input is not downsampled",),
        "nearest interpolation (a gather, no atomics)", 0.5),
    OperatorFact(
        "embedding backward", r"^aten::embedding(_dense_backward|_backward)?$|^embeddingbackward",
        "the embedding's backward adds every looked-up row's gradient into the table: atomics (or a sort of the "
        "indices) over the whole table, which is also zero-filled each step",
        ("nn.EmbeddingBag(mode='sum'/'mean') when the looked-up rows are pooled: gather and reduction in one op",
         "nn.Embedding(..., sparse=True) with torch.optim.SparseAdam for large tables: only the rows used",
         DETERMINISTIC_NOTE),
        "EmbeddingBag / a sparse gradient", 0.5),
    OperatorFact(
        "scatter and index accumulation",
        r"index_add|index_put|indexput|scatter_add|scatteradd|scatter_reduce|scatterreduce|^aten::scatter_?$|"
        r"^indexbackward|^indexselectbackward|^gatherbackward|^aten::_index_put_impl_",
        "index_add/index_put(accumulate)/scatter_add, and the backward of indexing, gather and index_select, add "
        "into the same rows from many threads (atomics on CUDA; serial or sorted paths elsewhere)",
        ("pool with nn.EmbeddingBag or a segment reduction over sorted indices instead of index_add into rows",
         "sort the indices once so writes to a row are adjacent (fewer atomic collisions)", DETERMINISTIC_NOTE),
        "a segment reduction over sorted indices", 0.5),
    OperatorFact(
        "full sort", r"^aten::(sort|argsort|msort)$|^sortbackward",
        "a full sort reads and writes the data log(n) times (radix passes); its backward scatters the gradient back "
        "to the sorted positions",
        ("torch.topk(x, k) with a small k instead of sort()[:k]; stable=False when stability is not needed",),
        "topk with a small k", 0.3),
    OperatorFact(
        "topk/kthvalue/unique", r"^aten::(topk|kthvalue|median|unique|_unique2|unique_dim|unique_consecutive)$|"
                                r"^(topk|kthvalue|median)backward",
        "topk with a large k (on CUDA) falls back to a sort; unique's output size is only known after it ran (a "
        "host sync on CUDA), and the ops after it change shape from step to step",
        ("a smaller k, or topk over a pre-filtered candidate set",
         "avoid unique() inside the step (the host waits for its size), or give it a fixed size"),
        "a smaller k or a fixed-size selection", 0.7),
    OperatorFact(
        "cumulative scans", r"^aten::(cumsum|cumprod|cummax|cummin|logcumsumexp)_?$|^(cumsum|cumprod|cummax|cummin|"
                            r"logcumsumexp)backward",
        "a scan is sequential along its dimension: it runs far below the memory bandwidth, and its backward is "
        "another scan (cumprod's a division or a second pass)",
        ("scan a shorter dimension, or compute the prefix over blocks (a small triangular matmul per block)",
         "torch.compile fuses the scan with its neighbours"),
        "a blocked or fused scan", 0.5),
    OperatorFact(
        "grid sampling", r"grid_?sampler",
        "grid_sample's backward scatters each output gradient to 4 (bilinear) or 8 input points with atomic adds",
        ("mode='nearest' where the quality allows; do not require the input's gradient when only the grid "
         "learns (input.detach())",),
        "nearest sampling (a gather, no atomics)", 0.5),
    OperatorFact(
        "data-dependent selection", r"^aten::(nonzero|masked_select|masked_scatter|argwhere)$|^maskedselectbackward|"
                                    r"^maskedscatterbackward",
        "nonzero and masked_select produce a size only known after they ran: the host waits for the device "
        "(a sync), and the ops after them change shape from step to step",
        ("keep the shapes fixed: torch.where(mask, x, 0) or x * mask instead of x[mask]; "
         "torch.nonzero_static(mask, size=n) where a bound is known",),
        "a fixed-shape torch.where", 0.3, HOST_DEVICE_SYNC),
    OperatorFact(
        "histograms and counts", r"^aten::(histc|histogram|bincount)$",
        "histc/bincount add into a few bins from every thread (atomic contention); bincount's size depends on the "
        "data (a host sync)",
        ("give bincount a fixed minlength and avoid it inside the step; one_hot(...).sum(0) for few bins",),
        "a one-hot sum over few bins", 0.5),
    OperatorFact(
        "CTC loss", r"ctc_loss|ctclossbackward",
        "the CTC loss runs a sequential dynamic programme per sample; its backward is a second one",
        ("torch.backends.cudnn's CTC (int32 targets, on the GPU, all input lengths equal to the maximum) or "
         "shorter input sequences",),
        "cuDNN's CTC", 0.5),
]


def fact_for(op: str) -> Optional[OperatorFact]:
    """The entry of the operator facts that covers this op name (forward aten op or backward node), or None."""
    return next((fact for fact in OPERATOR_FACTS if fact.matches(op)), None)

"""The operator view of a profiled run: where the device time goes by op, by nn.Module and by kernel name, per
step, with FLOPs, bytes moved, achieved rates and each op's place on the roofline.

FLOPs come from the op's recorded input shapes through torch.utils.flop_counter's own formulas (matmul, conv,
attention); bytes are the op's input tensors plus its output (estimated from its largest input where the trace
does not say). The ceilings are `perflab calibrate`'s (roofline.ceilings).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.diagnose.op_graph import VIEWS, OpCall, OpGraph
from perflab.results.records import Record
from perflab.diagnose.roofline import DTYPE_BYTES, DTYPE_PRECISION, Ceilings, ceilings
from perflab.diagnose.trace import ParsedTrace

TOP = 10
SMALL_CALL_US = 10.0  # a call this short is launch/latency-bound whatever its intensity
LATENCY_PCT_OF_ROOF = 10.0  # below this share of its roof an op is neither compute- nor bandwidth-bound
FLOP_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution", "aten::_convolution",
            "aten::cudnn_convolution", "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
            "aten::mkldnn_convolution")


@dataclass
class OperatorRow(Record):
    """One op's device time per step, its FLOPs and bytes, achieved rates and place on the roofline."""

    op: str
    module: str  # module_label of the modules it ran in
    line: Optional[str]  # the user's source line that called it, when the trace has stacks
    calls_per_step: float
    ms_per_step: float
    share_pct: float  # of the view's device time
    mean_us: float
    gflop_per_step: float
    mb_per_step: float
    dtype: str
    achieved_tflops: float
    achieved_gbps: float
    intensity_flop_per_byte: Optional[float]  # None when the trace does not say the bytes it moved
    bound: str = "unknown"  # roofline_place: compute, bandwidth, latency or unknown
    pct_of_roof: Optional[float] = None


@dataclass
class ModuleRow(Record):
    """One nn.Module's device time per step and its costliest op."""

    module: str
    ms_per_step: float
    share_pct: float
    calls_per_step: float
    top_op: str


@dataclass
class KernelSummaryRow(Record):
    """One kernel name per step, as nsys' cuda_gpu_kern_sum lists it."""

    name: str
    share_pct: float
    ms_per_step: float
    instances_per_step: float
    avg_us: float
    med_us: float
    min_us: float
    max_us: float


@dataclass
class OperatorView(Record):
    steps: int
    device_ms_per_step: float  # the time every op's device work adds up to (kernels on CUDA, ops on the CPU)
    time_source: str  # "GPU kernels" or "CPU op time"
    ceiling_source: str
    ops: list[OperatorRow] = field(default_factory=list)
    modules: list[ModuleRow] = field(default_factory=list)
    kernels: list[KernelSummaryRow] = field(default_factory=list)
    unattributed_pct: float = 0.0  # kernel time whose launching op is not in the trace


@dataclass
class _OpGroup:
    """The calls of one op name, summed while the view is built."""

    op: str
    calls: int = 0
    time_us: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = ""
    line: Optional[str] = None
    by_module: dict[str, float] = field(default_factory=dict)


@dataclass
class _ModuleGroup:
    """The calls made inside one module, summed while the view is built."""

    module: str
    calls: int = 0
    time_us: float = 0.0
    by_op: dict[str, float] = field(default_factory=dict)


def call_flops(trace: ParsedTrace, graph: OpGraph, call: OpCall) -> float:
    """FLOPs of one top-level call: the outermost op with a formula on every path below it (itself included)."""
    ops = trace.cpu_ops
    total = 0.0
    index = call.index
    members = np.concatenate(([index], graph.descendants(index)))
    counted_spans: list[tuple[float, float]] = []
    for member in members:  # in start order, outer before inner
        name = ops.name(int(member))
        if name not in FLOP_OPS:
            continue
        start, end = ops.start_us[member], ops.end_us[member]
        if any(s <= start and end <= e for s, e in counted_spans):
            continue
        inputs = trace.inputs.get(int(ops.ext_id[member]))
        if inputs is None:
            continue
        flops = op_flops(name, inputs[0])
        if flops:
            total += flops
            counted_spans.append((start, end))
    return total


def op_flops(name: str, dims: list) -> Optional[float]:
    """FLOPs of one aten op from its input dims, by torch.utils.flop_counter's formulas."""
    try:
        from torch.utils.flop_counter import conv_flop_count, flop_registry
        import torch
        aten = torch.ops.aten
        if name in ("aten::mm", "aten::bmm"):
            return float(flop_registry[getattr(aten, name[6:])](tuple(dims[0]), tuple(dims[1])))
        if name in ("aten::addmm", "aten::baddbmm"):
            return float(flop_registry[getattr(aten, name[6:])](tuple(dims[0]), tuple(dims[1]), tuple(dims[2])))
        if name in ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution"):
            x, w = dims[0], dims[1]
            out = _conv_out_shape(x, w)
            return float(conv_flop_count(x, w, out, transposed=False)) if out else None
        if name == "aten::convolution_backward":
            grad, x, w = dims[0], dims[1], dims[2]
            return 2.0 * conv_flop_count(x, w, grad, transposed=False)
        if name.startswith("aten::_scaled_dot_product"):
            q, k, v = dims[0], dims[1], dims[2]
            return float(flop_registry[getattr(aten, name[6:])](tuple(q), tuple(k), tuple(v)))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, AssertionError):
        return None
    return None


def _conv_out_shape(x: list, w: list) -> Optional[list]:
    """An output shape good enough for the FLOP formula: same spatial size (stride 1, 'same' padding)."""
    if len(x) < 3 or len(w) < 3:
        return None
    return [x[0], w[0], *x[2:]]


def call_bytes(trace: ParsedTrace, graph: OpGraph, call: OpCall) -> float:
    """Bytes read and written by one call: its input tensors plus an output as large as its largest input.

    A backward node records no shapes; the outermost aten ops under it that move data do, and their bytes are
    summed."""
    ops = trace.cpu_ops
    own = _tensor_bytes(trace.inputs.get(int(ops.ext_id[call.index])))
    if own:
        return own
    total, counted_spans = 0.0, []
    for member in graph.descendants(call.index):  # in start order, outer before inner
        name = ops.name(int(member))
        start, end = ops.start_us[member], ops.end_us[member]
        if not name.startswith("aten::") or name in VIEWS or any(s <= start and end <= e for s, e in counted_spans):
            continue
        moved = _tensor_bytes(trace.inputs.get(int(ops.ext_id[member])))
        if moved:
            total += moved
            counted_spans.append((start, end))
    return total


def _tensor_bytes(inputs) -> float:
    if not inputs:
        return 0.0
    dims, types = inputs
    sizes = []
    for index, shape in enumerate(dims):
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            continue
        dtype = types[index] if index < len(types) else "float"
        sizes.append(math.prod(shape) * DTYPE_BYTES.get(dtype, 4))
    return float(sum(sizes) + max(sizes)) if sizes else 0.0


def call_dtype(trace: ParsedTrace, graph: OpGraph, call: OpCall) -> str:
    """The first tensor input's dtype of the call (or of its first aten child)."""
    ops = trace.cpu_ops
    for index in (call.index, *graph.children(call.index)):
        inputs = trace.inputs.get(int(ops.ext_id[index]))
        if inputs:
            dims, types = inputs
            for shape, dtype in zip(dims, types):
                if isinstance(shape, list) and shape:
                    return dtype
    return ""


def operator_view(trace: ParsedTrace, start: float, end: float, steps: int,
                  precision: Optional[str] = None, graph: Optional[OpGraph] = None) -> OperatorView:
    """Top ops, modules and kernels of the profiled steps, with FLOPs, bytes and their roofline place."""
    graph = graph or OpGraph(trace, start, end)
    steps = max(steps, 1)
    roof = ceilings(trace)
    on_gpu = trace.has_gpu
    total_us = _device_total_us(trace, graph, start, end)
    groups: dict[str, _OpGroup] = {}
    modules: dict[str, _ModuleGroup] = {}
    for call in graph.calls:
        if call.device_us <= 0:
            continue
        group = groups.setdefault(call.name, _OpGroup(op=call.name))
        group.calls += 1
        group.time_us += call.device_us
        group.flops += call_flops(trace, graph, call)
        group.bytes += call_bytes(trace, graph, call)
        group.dtype = group.dtype or call_dtype(trace, graph, call)
        module = call.module or "(no module)"
        group.by_module[module] = group.by_module.get(module, 0.0) + call.device_us
        group.line = group.line or call.line
        entry = modules.setdefault(module, _ModuleGroup(module=module))
        entry.time_us += call.device_us
        entry.calls += 1
        entry.by_op[call.name] = entry.by_op.get(call.name, 0.0) + call.device_us
    op_rows = [_op_row(g, roof, precision, total_us, steps, on_gpu)
               for g in sorted(groups.values(), key=lambda g: -g.time_us)[:TOP]]
    module_rows = [ModuleRow(module=m.module, ms_per_step=m.time_us / 1e3 / steps,
                             share_pct=100 * m.time_us / total_us if total_us else 0.0,
                             calls_per_step=m.calls / steps, top_op=max(m.by_op, key=m.by_op.get))
                   for m in sorted(modules.values(), key=lambda m: -m.time_us)[:TOP]]
    attributed = sum(g.time_us for g in groups.values())
    return OperatorView(steps=steps, device_ms_per_step=total_us / 1e3 / steps,
                        time_source="GPU kernels" if on_gpu else "CPU op time", ceiling_source=roof.source,
                        ops=op_rows, modules=module_rows, kernels=kernel_summary(trace, start, end, steps),
                        unattributed_pct=max(0.0, 100 * (1 - attributed / total_us)) if total_us else 0.0)


def _device_total_us(trace: ParsedTrace, graph: OpGraph, start: float, end: float) -> float:
    if trace.has_gpu:
        k = trace.kernels
        inside = (k.start_us >= start) & (k.start_us < end)
        return float(k.dur_us[inside].sum())
    return float(sum(call.device_us for call in graph.calls))


def _op_row(group: _OpGroup, roof: Ceilings, precision: Optional[str], total_us: float, steps: int,
            on_gpu: bool) -> OperatorRow:
    time_us, flops, moved = group.time_us, group.flops, group.bytes
    row = OperatorRow(op=group.op, module=module_label(group.by_module), line=group.line,
                      calls_per_step=group.calls / steps, ms_per_step=time_us / 1e3 / steps,
                      share_pct=100 * time_us / total_us if total_us else 0.0, mean_us=time_us / group.calls,
                      gflop_per_step=flops / 1e9 / steps, mb_per_step=moved / 2**20 / steps, dtype=group.dtype,
                      achieved_tflops=flops / (time_us * 1e6) if time_us else 0.0,
                      achieved_gbps=moved / (time_us * 1e3) if time_us else 0.0,
                      intensity_flop_per_byte=flops / moved if moved else None)
    row.bound, row.pct_of_roof = roofline_place(row, roof, precision, on_gpu)
    return row


def module_label(by_module: dict[str, float]) -> str:
    """One module, the repeated blocks it ran in ('blocks.*.qkv'), or the costliest with how many more."""
    top = max(by_module, key=by_module.get)
    if len(by_module) == 1:
        return top
    shapes = {module_shape(name) for name in by_module}
    return shapes.pop() if len(shapes) == 1 else f"{top} (+{len(by_module) - 1})"


def module_shape(name: str) -> str:
    """A module path with what varies between repeated blocks starred: ModuleList indices (blocks.3) and the
    profiler's instance numbers (Linear_13)."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", re.sub(r"_\d+(?=\.|$)", "_*", name))


def roofline_place(row: OperatorRow, roof: Ceilings, precision: Optional[str],
                   on_gpu: bool) -> tuple[str, Optional[float]]:
    """'compute', 'bandwidth', 'latency' (too small or far below both roofs) or 'unknown' without ceilings."""
    if on_gpu and row.mean_us < SMALL_CALL_US:
        return "latency", None
    dtype_precision = DTYPE_PRECISION.get(row.dtype, "fp32")
    if dtype_precision == "fp32" and precision == "tf32":
        dtype_precision = "tf32"
    peak = roof.tflops.get(dtype_precision)
    bandwidth = roof.memory_gbps
    intensity = row.intensity_flop_per_byte
    if not peak or not bandwidth or intensity is None:
        return "unknown", None  # no ceilings, or the bytes the op moved are not in the trace
    ridge = peak * 1e12 / (bandwidth * 1e9)
    if intensity >= ridge:
        pct = 100 * row.achieved_tflops / peak
        bound = "compute"
    else:
        pct = 100 * row.achieved_gbps / bandwidth
        bound = "bandwidth"
    if pct < LATENCY_PCT_OF_ROOF:
        bound = "latency"
    return bound, pct


def kernel_summary(trace: ParsedTrace, start: float, end: float, steps: int,
                   top: int = TOP) -> list[KernelSummaryRow]:
    """Top kernels by name over the window, as nsys' cuda_gpu_kern_sum lists them (per step)."""
    k = trace.kernels
    if not len(k):
        return []
    inside = (k.start_us >= start) & (k.start_us < end)
    total = float(k.dur_us[inside].sum()) or 1e-9
    rows = []
    ids = k.name_id[inside]
    durations = k.dur_us[inside]
    totals = np.bincount(ids, weights=durations, minlength=len(k.names))
    for name_id in np.argsort(-totals)[:top]:
        if totals[name_id] <= 0:
            break
        mine = durations[ids == name_id]
        rows.append(KernelSummaryRow(name=k.names[name_id], share_pct=100 * totals[name_id] / total,
                                     ms_per_step=totals[name_id] / 1e3 / steps, instances_per_step=len(mine) / steps,
                                     avg_us=float(mine.mean()), med_us=float(np.median(mine)),
                                     min_us=float(mine.min()), max_us=float(mine.max())))
    return rows

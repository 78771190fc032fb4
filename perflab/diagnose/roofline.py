"""Arithmetic intensity and roofline placement of matmul/conv calls whose shapes the trace recorded.

FLOPs and bytes come from the op's input shapes (record_shapes); time is the GPU kernels linked to the op
(External id) on CUDA, the op's own duration on the CPU. Ceilings: `perflab calibrate`'s cache for this
device, else the datasheet, labelled as such.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from perflab.results.records import Record
from perflab.diagnose.trace import OpShapes, ParsedTrace
from perflab.calibrate import DATASHEET, measured_ceilings, measured_ceilings_named

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "c10::Float8_e4m3fn": 1}
DTYPE_PRECISION = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp32"}
# aten op -> positions of (stride, padding, dilation, groups) among its inputs
CONV_ARGS = {"aten::convolution": (3, 4, 5, 8), "aten::_convolution": (3, 4, 5, 8),
             "aten::cudnn_convolution": (3, 2, 4, 5), "aten::mkldnn_convolution": (4, 3, 5, 6)}


def _numel(dims) -> int:
    return int(np.prod(dims)) if dims else 1


def _concrete(op: OpShapes, index: int, default):
    try:
        text = op.concrete[index]
        return ast.literal_eval(text) if text not in ("", None) else default
    except (IndexError, ValueError, SyntaxError):
        return default


def flops_and_bytes(op: OpShapes) -> Optional[tuple[float, float]]:
    """(FLOPs, bytes read + written) of one call, or None when the shapes do not say."""
    dims = op.dims
    elt = DTYPE_BYTES.get(op.types[0] if op.types else "float", 4)
    try:
        if op.name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 2.0 * m * k * n, elt * (m * k + k * n + m * n)
        if op.name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            elt = DTYPE_BYTES.get(op.types[1], 4) if len(op.types) > 1 else elt
            return 2.0 * m * k * n, elt * (m * k + k * n + 2 * m * n)
        if op.name in ("aten::bmm", "aten::baddbmm"):
            a, b = (dims[0], dims[1]) if op.name == "aten::bmm" else (dims[1], dims[2])
            (batch, m, k), (_, _, n) = a, b
            return 2.0 * batch * m * k * n, elt * batch * (m * k + k * n + m * n)
        if op.name in CONV_ARGS:
            return _conv(op, elt)
    except (ValueError, TypeError, IndexError):
        return None
    return None


def _conv(op: OpShapes, elt: int) -> Optional[tuple[float, float]]:
    x, w = op.dims[0], op.dims[1]
    if len(x) != 4 or len(w) != 4:
        return None
    stride_at, pad_at, dil_at, groups_at = CONV_ARGS[op.name]
    stride = _concrete(op, stride_at, None)
    padding = _concrete(op, pad_at, None)
    dilation = _concrete(op, dil_at, [1, 1])
    if stride is None or padding is None:
        return None
    n, _, h, width = x
    out_c, in_per_group, kh, kw = w
    ho = math.floor((h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1)
    wo = math.floor((width + 2 * padding[-1] - dilation[-1] * (kw - 1) - 1) / stride[-1] + 1)
    flops = 2.0 * n * out_c * ho * wo * in_per_group * kh * kw
    return flops, elt * (_numel(x) + _numel(w) + n * out_c * ho * wo)


@dataclass
class Ceilings:
    """The traced device's roofs: peak TFLOP/s by precision (fp32, tf32, bf16, ...) and memory GB/s, and where
    they come from."""

    source: str
    tflops: dict[str, float] = field(default_factory=dict)
    memory_gbps: Optional[float] = None


@dataclass
class RooflineRow(Record):
    """One matmul/conv shape: its FLOPs, bytes, intensity, achieved rate and place on the roofline."""

    op: str
    shapes: str  # the first three input shapes
    dtype: str
    calls: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    time_us: float = 0.0
    intensity_flop_per_byte: Optional[float] = None
    achieved_tflops: float = 0.0
    achieved_gbps: float = 0.0
    peak_tflops: Optional[float] = None
    memory_gbps: Optional[float] = None
    ceiling_source: str = ""
    bound: Optional[str] = None  # "compute" or "memory"; None without ceilings
    pct_of_roof: Optional[float] = None
    ridge_flop_per_byte: Optional[float] = None


def ceilings(trace: ParsedTrace) -> Ceilings:
    """Peak TFLOP/s by precision and memory GB/s for the traced device, with their source."""
    name = trace.gpu_name
    if name:
        named = measured_ceilings_named(name)
        if named:
            return Ceilings(tflops=named[0].tflops, memory_gbps=named[0].memory_gbps,
                            source=f"calibrated {named[0].measured_utc}")
        for model, sheet in DATASHEET.items():  # ordered: "H100 PCIe" before "H100"
            if all(part in name for part in model.split()):
                return Ceilings(tflops={k: v for k, v in sheet.items() if k != "memory_gbps"},
                                memory_gbps=sheet["memory_gbps"], source=f"datasheet ({model})")
        return Ceilings(source="none: unknown GPU")
    if trace.has_gpu:
        return Ceilings(source="none: the trace names no device")
    import torch
    measured = measured_ceilings(torch.device("cpu"))
    if measured:  # the CPU that runs diagnose; right when diagnosing a trace recorded here
        return Ceilings(tflops=measured.tflops, memory_gbps=measured.memory_gbps,
                        source=f"calibrated on this CPU {measured.measured_utc}")
    return Ceilings(source="none: run `perflab calibrate` for CPU ceilings")


def _op_time_us(trace: ParsedTrace) -> dict[int, float]:
    """External id -> time of that op call: its linked kernels on CUDA, its own duration on the CPU."""
    if trace.has_gpu:
        k = trace.kernels
        linked = np.isin(k.ext_id, np.fromiter(trace.shapes, dtype=np.int64, count=len(trace.shapes)))
        times: dict[int, float] = {}
        for ext, dur in zip(k.ext_id[linked], k.dur_us[linked]):
            times[int(ext)] = times.get(int(ext), 0.0) + float(dur)
        return times
    # on the CPU the outermost shaped op carries the time; nested ones (convolution -> mkldnn_convolution) repeat it
    outer = {"aten::convolution", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
    return {ext: op.dur_us for ext, op in trace.shapes.items() if op.name in outer}


def roofline_rows(trace: ParsedTrace, top: int = 5, precision: Optional[str] = None) -> list[RooflineRow]:
    """The heaviest matmul/conv shapes: FLOPs, bytes, intensity, achieved rate and where they sit on the roofline."""
    if not trace.shapes:
        return []
    times = _op_time_us(trace)
    groups: dict[tuple, RooflineRow] = {}
    for ext, time_us in times.items():
        op = trace.shapes[ext]
        counted = flops_and_bytes(op)
        if counted is None or time_us <= 0:
            continue
        key = (op.name, str(op.dims[:3]), op.types[0] if op.types else "")
        row = groups.setdefault(key, RooflineRow(op=op.name, shapes=key[1], dtype=key[2]))
        row.calls += 1
        row.flops += counted[0]
        row.bytes += counted[1]
        row.time_us += time_us
    roof = ceilings(trace)
    rows = sorted(groups.values(), key=lambda row: -row.time_us)[:top]
    for row in rows:
        _place(row, roof, precision)
    return rows


def _place(row: RooflineRow, roof: Ceilings, precision: Optional[str]) -> None:
    """Fill in the row's rates and its place under the roofs."""
    row.intensity_flop_per_byte = intensity = row.flops / row.bytes if row.bytes else None
    row.achieved_tflops = row.flops / (row.time_us * 1e6)
    row.achieved_gbps = row.bytes / (row.time_us * 1e3)
    dtype_precision = DTYPE_PRECISION.get(row.dtype, "fp32")
    precision = "tf32" if dtype_precision == "fp32" and precision == "tf32" else dtype_precision
    row.peak_tflops = peak = roof.tflops.get(precision)
    row.memory_gbps = bandwidth = roof.memory_gbps
    row.ceiling_source = roof.source
    if peak and bandwidth and intensity:
        ridge = peak * 1e12 / (bandwidth * 1e9)
        roof_tflops = min(peak, intensity * bandwidth / 1e3)
        row.ridge_flop_per_byte = ridge
        row.bound = "compute" if intensity >= ridge else "memory"
        row.pct_of_roof = 100 * row.achieved_tflops / roof_tflops

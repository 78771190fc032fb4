"""The op graph of a parsed trace: every op call of the profiled steps with its parent, the top-level op it
belongs to, its nn.Module path, its Python line, and the device time charged to it.

GPU kernels reach their op through the launch call (kernel correlation -> runtime call -> External id -> CPU op);
on a CPU trace an op's own duration is its time. Backward ops reach the forward op that made them through the
autograd Sequence number, and so its module. Module paths come from perflab's `module: <path>` ranges (the
capture's module hooks) or, on a trace recorded with_stack, from the profiler's `nn.Module: <Class>_<n>` frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from perflab.diagnose.trace import EventTable, ParsedTrace

from perflab.profile.module_marks import MODULE_MARK  # perflab's per-module ranges
PY_MODULE = "nn.Module: "
BACKWARD_WRAPPER = "autograd::engine::evaluate_function: "

# ops that make views: they move no data
VIEWS = {"aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::t", "aten::expand",
         "aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::unflatten", "aten::select", "aten::slice",
         "aten::split", "aten::chunk", "aten::unbind", "aten::detach", "aten::alias", "aten::as_strided"}


@dataclass
class OpCall:
    """One top-level op call (an aten op the user's code called, or a backward node) in the profiled steps."""

    index: int  # row in trace.cpu_ops
    name: str  # aten::linear, aten::softmax, MmBackward0, ...
    start_us: float
    end_us: float
    tid: int
    device_us: float  # GPU kernels it launched (CUDA) or its own duration (CPU)
    kernels: int
    module: Optional[str]
    line: Optional[str]
    backward: bool
    seq: int  # autograd Sequence number (-1 when none)


class OpGraph:
    """Parent links of the CPU ops, the top-level calls in the window, and the lookups the rules need."""

    def __init__(self, trace: ParsedTrace, start: float, end: float) -> None:
        self.trace = trace
        ops = trace.cpu_ops
        self.parent = _parents(ops)
        self._thread_order = {int(tid): np.flatnonzero(ops.tid == tid) for tid in np.unique(ops.tid)}
        self._position = np.zeros(len(ops), dtype=np.int64)
        for order in self._thread_order.values():
            self._position[order] = np.arange(len(order))
        self._children: dict[int, np.ndarray] = {}
        has_parent = np.flatnonzero(self.parent >= 0)
        for parent, child in zip(self.parent[has_parent], has_parent):
            self._children.setdefault(int(parent), []).append(int(child))
        self._children = {k: np.array(v, dtype=np.int64) for k, v in self._children.items()}
        self.seq = ops.extra.astype(np.int64) if len(ops) else np.empty(0, dtype=np.int64)
        self.is_top = self._top_mask()
        self.top_of = self._top_of()
        in_window = (ops.start_us >= start) & (ops.start_us < end)
        self.device_us, self.kernel_count = self._device_time(in_window)
        self.modules = ModuleLookup(trace)
        self.lines = _LineLookup(trace)
        self.calls = self._calls(np.flatnonzero(self.is_top & in_window))

    def children(self, index: int) -> np.ndarray:
        return self._children.get(int(index), np.empty(0, dtype=np.int64))

    def descendants(self, index: int) -> np.ndarray:
        """Every op nested inside `index` on its thread: the ops after it in its thread's order that start
        before it ends."""
        ops = self.trace.cpu_ops
        order = self._thread_order[int(ops.tid[index])]
        position = self._position[index]
        last = int(np.searchsorted(ops.start_us[order], ops.end_us[index], side="left"))
        return order[position + 1:max(position + 1, last)]

    def _top_mask(self) -> np.ndarray:
        """Ops that are an aten op or a backward node with no such op above them (wrappers do not count)."""
        ops = self.trace.cpu_ops
        countable = ops.mask(_is_countable)
        top = np.zeros(len(ops), dtype=bool)
        for index in np.flatnonzero(countable):
            parent = self.parent[index]
            while parent >= 0 and not countable[parent]:
                parent = self.parent[parent]
            top[index] = parent < 0
        return top

    def _top_of(self) -> np.ndarray:
        top_of = np.full(len(self.parent), -1, dtype=np.int64)
        for index in range(len(self.parent)):
            node = index
            while node >= 0 and not self.is_top[node]:
                node = self.parent[node]
            top_of[index] = node
        return top_of

    def _device_time(self, in_window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per CPU op: kernel time it launched (CUDA), else its own duration; and how many kernels."""
        trace, ops = self.trace, self.trace.cpu_ops
        device_us = np.zeros(len(ops))
        count = np.zeros(len(ops), dtype=np.int64)
        if not trace.has_gpu:
            device_us[in_window] = ops.dur_us[in_window]
            return device_us, count
        owner = kernel_owner(trace)
        k = trace.kernels
        linked = owner >= 0
        np.add.at(device_us, owner[linked], k.dur_us[linked])
        np.add.at(count, owner[linked], 1)
        return device_us, count

    def _calls(self, tops: np.ndarray) -> list[OpCall]:
        ops = self.trace.cpu_ops
        # what each top op's subtree launched on the GPU (or took on the CPU)
        device_us = np.zeros(len(ops))
        kernels = np.zeros(len(ops), dtype=np.int64)
        if self.trace.has_gpu:
            has = (self.top_of >= 0) & ((self.device_us > 0) | (self.kernel_count > 0))
            np.add.at(device_us, self.top_of[has], self.device_us[has])
            np.add.at(kernels, self.top_of[has], self.kernel_count[has])
        else:
            device_us = self.device_us
        forward_module = self._forward_modules()
        calls = []
        for index in tops:
            raw = ops.name(index)
            backward = _is_backward(raw)
            seq = int(self.seq[index])
            if backward:
                module, line = forward_module.get(seq, (None, None))
            else:
                module = self.modules.at(ops.start_us[index], int(ops.tid[index]))
                line = self.lines.at(ops.start_us[index], int(ops.tid[index]))
            calls.append(OpCall(index=int(index), name=raw.removeprefix(BACKWARD_WRAPPER), start_us=float(ops.start_us[index]),
                                end_us=float(ops.end_us[index]), tid=int(ops.tid[index]),
                                device_us=float(device_us[index]), kernels=int(kernels[index]), module=module,
                                line=line, backward=backward, seq=seq))
        return calls

    def _forward_modules(self) -> dict[int, tuple[Optional[str], Optional[str]]]:
        """Sequence number -> (module, line) of the forward op that recorded it."""
        ops = self.trace.cpu_ops
        found: dict[int, tuple[Optional[str], Optional[str]]] = {}
        for index in np.flatnonzero(self.seq >= 0):
            name = ops.name(index)
            if _is_backward(name) or not name.startswith("aten::"):
                continue
            seq = int(self.seq[index])
            if seq not in found:
                t, tid = ops.start_us[index], int(ops.tid[index])
                found[seq] = (self.modules.at(t, tid), self.lines.at(t, tid))
        return found


def kernel_owner(trace: ParsedTrace) -> np.ndarray:
    """Per kernel, the CPU op row that launched it (kernel -> launch call by correlation -> External id or the
    innermost op around the call); -1 when unknown."""
    k, rt, ops = trace.kernels, trace.runtime, trace.cpu_ops
    owner = np.full(len(k), -1, dtype=np.int64)
    if not len(k) or not len(rt) or not len(ops):
        return owner
    order = np.argsort(rt.correlation)
    corr_sorted = rt.correlation[order]
    pos = np.clip(np.searchsorted(corr_sorted, k.correlation), 0, len(order) - 1)
    found = (corr_sorted[pos] == k.correlation) & (k.correlation >= 0)
    launch = np.where(found, order[pos], -1)
    by_ext = {int(ext): i for i, ext in enumerate(ops.ext_id) if ext >= 0}
    for kernel in np.flatnonzero(launch >= 0):
        call = launch[kernel]
        ext = int(rt.ext_id[call])
        op = by_ext.get(ext, -1) if ext >= 0 else -1
        if op < 0:
            op = _innermost(ops, rt.start_us[call], int(rt.tid[call]))
        owner[kernel] = op
    return owner


def _innermost(ops: EventTable, t: float, tid: int) -> int:
    around = np.flatnonzero((ops.tid == tid) & (ops.start_us <= t) & (ops.end_us >= t))
    return int(around[np.argmax(ops.start_us[around])]) if len(around) else -1


def _parents(ops: EventTable) -> np.ndarray:
    """Per op, the op directly around it on the same thread (-1 at the top)."""
    parent = np.full(len(ops), -1, dtype=np.int64)
    for tid in np.unique(ops.tid):
        stack: list[int] = []
        for i in np.flatnonzero(ops.tid == tid):  # in start order
            while stack and ops.end_us[stack[-1]] <= ops.start_us[i]:
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(int(i))
    return parent


def _is_backward(name: str) -> bool:
    return name.startswith(BACKWARD_WRAPPER) or name.endswith(("Backward0", "Backward1"))


def _is_countable(name: str) -> bool:
    return name.startswith("aten::") or name.startswith(BACKWARD_WRAPPER)


class _Nesting:
    """The selected events of a table, nested per thread: the innermost one around a time, and its enclosing chain,
    in O(log n) plus the depth (events of one thread nest; sorted by start, each one's parent is found once)."""

    def __init__(self, table: EventTable, selected: np.ndarray) -> None:
        self.table = table
        self.index = np.flatnonzero(selected)
        self.parent = np.full(len(self.index), -1, dtype=np.int64)  # positions in self.index
        self.by_tid: dict[int, np.ndarray] = {}
        tids = table.tid[self.index]
        for tid in np.unique(tids):
            positions = np.flatnonzero(tids == tid)  # self.index is in start order, so these are too
            self.by_tid[int(tid)] = positions
            stack: list[int] = []
            for position in positions:
                event = self.index[position]
                while stack and table.end_us[self.index[stack[-1]]] <= table.start_us[event]:
                    stack.pop()
                if stack:
                    self.parent[position] = stack[-1]
                stack.append(int(position))

    def innermost(self, t: float, tid: int) -> int:
        """Position (in self.index) of the innermost selected event around t on the thread, or -1."""
        positions = self.by_tid.get(tid)
        if positions is None or not len(positions):
            return -1
        starts = self.table.start_us[self.index[positions]]
        at = int(np.searchsorted(starts, t, side="right")) - 1
        position = int(positions[at]) if at >= 0 else -1
        while position >= 0 and self.table.end_us[self.index[position]] < t:
            position = int(self.parent[position])  # it ended before t: its enclosing one may still be open
        return position

    def chain(self, position: int) -> list[int]:
        """Event rows from the outermost enclosing one to this one."""
        rows = []
        while position >= 0:
            rows.append(int(self.index[position]))
            position = int(self.parent[position])
        return rows[::-1]


class ModuleLookup:
    """The nn.Module path around a time on a thread: perflab's module ranges, else the profiler's module frames."""

    def __init__(self, trace: ParsedTrace) -> None:
        ann, py = trace.annotations, trace.python
        self.ann, self.py = ann, py
        self.marks = _Nesting(ann, ann.mask(lambda n: n.startswith(MODULE_MARK)))
        self.frames = _Nesting(py, py.mask(lambda n: n.startswith(PY_MODULE)))

    def at(self, t: float, tid: int) -> Optional[str]:
        position = self.marks.innermost(t, tid)
        if position >= 0:
            return self.ann.name(int(self.marks.index[position])).removeprefix(MODULE_MARK) or "(model)"
        position = self.frames.innermost(t, tid)
        if position >= 0:
            return ".".join(self.py.name(row).removeprefix(PY_MODULE) for row in self.frames.chain(position))
        return None


class _LineLookup:
    """The innermost user Python frame around a time on a thread (traces recorded with_stack)."""

    def __init__(self, trace: ParsedTrace) -> None:
        self.py = trace.python
        self.user = _Nesting(self.py, self.py.mask(is_user_frame) if len(self.py) else np.zeros(0, dtype=bool))

    def at(self, t: float, tid: int) -> Optional[str]:
        position = self.user.innermost(t, tid)
        return self.py.name(int(self.user.index[position])) if position >= 0 else None


def is_user_frame(name: str) -> bool:
    """Not torch's own code, the standard library or a built-in: the frame the user can change."""
    if name.startswith(("<built-in", "nn.Module:", "torch/", "<frozen")):
        return False
    return not any(part in name for part in ("/torch/", "/lib/python", "threading.py", "contextlib.py"))

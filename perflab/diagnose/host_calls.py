"""Who spends the host's time: the Python built-in calls of the user's own code (`torch.tensor` of a Python list,
`np.*`, `.numpy()`), by self time — their duration less the torch ops inside them — grouped by the frame that made
them. A launch-bound step whose host is slow because of one such call is slow for that call, not for launching:
the call is named before the launch levers. Needs a trace recorded with Python stacks (perflab profile records
them); without, there is nothing to name."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from perflab.diagnose.intervals import Intervals
from perflab.diagnose.trace import ParsedTrace

# Calls other rules or the framework own: waits (threads, the sync rule's reads), the autograd engine (its ops run on
# other threads), the profiler's own bookkeeping, a DataLoader's next() (the input-pipeline rule).
NOT_HOST_WORK = {"acquire", "wait", "run_backward", "_record_function_enter_new", "_record_function_exit", "next",
                 "item", "tolist", "synchronize", "cpu", "numpy", "__exit__", "__enter__"}
FRAMEWORK_FILES = re.compile(r"(^|/)(torch|perflab|threading|runpy|<frozen|contextlib|tqdm|numpy|rich|pynvml|enum|typing|"
                             r"functools|queue|selectors|multiprocessing|concurrent|site-packages|dist-packages)[/.]")
BUILTIN = re.compile(r"^<built-in (?:method|function) (\w+)")
MIN_STEP_PCT = 10.0  # from here a call's host time is named beside the launches


@dataclass
class HostCall:
    """One built-in call made from one frame of the user's code, per step."""

    call: str  # "tensor" (torch.tensor), "array", ...
    caller: str  # "model.py(27): forward"
    calls_per_step: float
    ms_per_step: float  # self time: the call's duration less the torch ops inside it

    def text(self, step_ms: float) -> str:
        share = 100 * self.ms_per_step / step_ms if step_ms > 0 else 0.0
        return (f"the host spends {share:.0f}% of the step in {self.call}() at {self.caller} "
                f"({self.calls_per_step:g} calls a step, {self.ms_per_step:.2f} ms)")


def top_host_call(trace: ParsedTrace, start: float, end: float, steps: int) -> Optional[HostCall]:
    """The user's built-in call with the most self time per step inside [start, end], or None."""
    calls = host_calls(trace, start, end, steps)
    return calls[0] if calls else None


def host_calls(trace: ParsedTrace, start: float, end: float, steps: int) -> list[HostCall]:
    """Every built-in call of the user's code in the window, costliest first."""
    py, ops = trace.python, trace.cpu_ops
    if not len(py):
        return []
    inside = np.flatnonzero((py.start_us >= start) & (py.end_us <= end))
    frames = _user_frames(py, inside)
    totals: dict[tuple[str, str], list[float]] = {}
    for index in inside:
        match = BUILTIN.match(py.name(int(index)))
        if match is None or match.group(1) in NOT_HOST_WORK:
            continue
        caller = _innermost(frames, py, int(index))
        if caller is None:
            continue
        self_us = py.dur_us[index] - _ops_inside(ops, py.tid[index], py.start_us[index], py.end_us[index])
        entry = totals.setdefault((match.group(1), caller), [0.0, 0.0])
        entry[0] += 1
        entry[1] += max(0.0, float(self_us))
    found = [HostCall(call, caller, count / steps, self_us / 1e3 / steps)
             for (call, caller), (count, self_us) in totals.items()]
    return sorted(found, key=lambda c: -c.ms_per_step)


def _user_frames(py, inside: np.ndarray) -> np.ndarray:
    """The indices of Python frames of the user's own files (not torch, perflab, the standard library's threads)."""
    keep = [int(i) for i in inside if not py.name(int(i)).startswith("<") and not FRAMEWORK_FILES.search(py.name(int(i)))]
    return np.array(keep, dtype=np.int64)


def _innermost(frames: np.ndarray, py, index: int) -> Optional[str]:
    """The shortest user frame on the same thread that encloses event `index` (its caller), or None: a call made
    from torch's or perflab's own code is not the user's."""
    if not len(frames):
        return None
    around = frames[(py.tid[frames] == py.tid[index]) & (py.start_us[frames] <= py.start_us[index])
                    & (py.end_us[frames] >= py.end_us[index])]
    if not len(around):
        return None
    caller = around[np.argmin(py.dur_us[around])]
    # a torch frame between the user's frame and the call (nn.Module machinery) makes it torch's call, not theirs
    between = (py.tid == py.tid[index]) & (py.start_us >= py.start_us[caller]) & (py.end_us <= py.end_us[caller]) \
        & (py.start_us <= py.start_us[index]) & (py.end_us >= py.end_us[index]) & (py.dur_us < py.dur_us[caller])
    for other in np.flatnonzero(between):
        name = py.name(int(other))
        if not name.startswith("<") and FRAMEWORK_FILES.search(name):
            return None
    return py.name(int(caller))


def _ops_inside(ops, tid: float, start: float, end: float) -> float:
    """The time torch ops ran inside [start, end] on thread `tid` (nested ops counted once)."""
    if not len(ops):
        return 0.0
    mask = (ops.tid == tid) & (ops.start_us >= start) & (ops.end_us <= end)
    return Intervals.union(ops.start_us[mask], ops.end_us[mask]).total if mask.any() else 0.0

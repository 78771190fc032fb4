"""One marker API: `perflab.mark("name")` emits an NVTX range and a torch.profiler range at once.

Use it as a context manager (`with mark("decode"): ...`) or a decorator (`@mark("decode")`). Each half
costs nothing when its consumer is absent: the record_function range only while torch.profiler is
recording, the NVTX range only when CUDA is available.
"""
from __future__ import annotations

from contextlib import ContextDecorator
from typing import Callable, Optional

import torch

_CUDA = torch.cuda.is_available()
_step_end_listener: Optional[Callable[[], None]] = None  # perflab's script probe: a "step" range ended


def listen_for_step_ends(listener: Optional[Callable[[], None]]) -> Optional[Callable[[], None]]:
    """Call `listener()` whenever a `mark("step")` range ends without an exception; returns the previous listener."""
    global _step_end_listener
    previous, _step_end_listener = _step_end_listener, listener
    return previous


def _profiler_recording() -> bool:
    return torch._C._autograd._profiler_enabled()


class mark(ContextDecorator):
    """A named range visible in Nsight Systems (NVTX) and in torch.profiler traces."""

    __slots__ = ("name", "_record")

    def __init__(self, name: str):
        self.name = name
        self._record = None

    def __enter__(self) -> "mark":
        if _CUDA:
            torch.cuda.nvtx.range_push(self.name)
        if _profiler_recording():
            self._record = torch.profiler.record_function(self.name)
            self._record.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        if self._record is not None:
            self._record.__exit__(*exc)
            self._record = None
        if _CUDA:
            torch.cuda.nvtx.range_pop()
        if _step_end_listener is not None and self.name == "step" and (not exc or exc[0] is None):
            _step_end_listener()
        return False


class no_mark:
    """Stands in for `mark` when markers are off (StepPlan.markers = False): enters and exits, records nothing."""

    __slots__ = ()

    def __init__(self, name: str):
        pass

    def __enter__(self) -> "no_mark":
        return self

    def __exit__(self, *exc) -> bool:
        return False


def phase_marker(enabled: bool) -> type:
    """The marker class the loop uses: `mark`, or `no_mark` when markers are switched off."""
    return mark if enabled else no_mark

"""Where in the step the host was: perflab's phase ranges, the profiled steps, and the DataLoader's own ranges."""
from __future__ import annotations

from perflab.diagnose.intervals import Intervals, intervals_of
from perflab.diagnose.trace import ParsedTrace
from perflab.step.phases import COMPUTE_PHASES, MARKED_PHASES

PHASES = MARKED_PHASES  # the ranges the timed loop marks, in step order (perflab/step/phases.py)
__all__ = ["PHASES", "COMPUTE_PHASES", "MODEL_PHASES", "phase_intervals", "loader_intervals", "step_intervals"]
MODEL_PHASES = ("forward", "backward")
# torch.profiler marks each DataLoader fetch as `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`
# (or _MultiProcessing...); a user's own loop has no perflab `data` phase, but still has these.
LOADER_MARK = "enumerate(DataLoader)#"


def phase_intervals(trace: ParsedTrace, names) -> Intervals:
    """The union of the `record_function` ranges with one of these names."""
    ann = trace.annotations
    return intervals_of(ann, ann.mask(lambda n: n in names))


def loader_intervals(trace: ParsedTrace) -> Intervals:
    """Where the main process was inside the DataLoader: the `data` phase and every `DataLoader.__next__`."""
    ann = trace.annotations
    return intervals_of(ann, ann.mask(lambda n: n == "data" or (n.startswith(LOADER_MARK) and "__next__" in n)))


def step_intervals(trace: ParsedTrace) -> Intervals:
    """The profiled steps (`ProfilerStep#N` ranges); empty when the trace has none."""
    ann = trace.annotations
    return intervals_of(ann, ann.mask(lambda n: n.startswith("ProfilerStep#")))

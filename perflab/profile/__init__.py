"""Profiling: markers (NVTX + record_function), profiler capture, the Nsight Systems command."""
from perflab.profile.markers import mark

__all__ = ["mark"]

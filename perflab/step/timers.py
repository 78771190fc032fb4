"""Phase timers the loop wears: CUDA events (no host sync), the host clock, or synced host clock.

A timer records, per step, when the step began and how long each named phase took. Data wait is always
host time (the host blocked on the loader); the other phases use the timer's clock.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class NullTimer:
    """Used during warm-up: records nothing."""

    def step_start(self) -> None:
        pass

    def finish(self) -> None:
        pass

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    @contextmanager
    def host_phase(self, name: str) -> Iterator[None]:
        yield


class HostClockTimer:
    """perf_counter around each phase; exact on CPU, and with `sync=True` on CUDA (adds host syncs)."""

    method = "host clock (perf_counter); the CPU runs synchronously"

    def __init__(self, device: torch.device, sync: bool = False):
        self.sync = sync and device.type == "cuda"
        if self.sync:
            self.method = "host clock with torch.cuda.synchronize() at every phase boundary (--sync-phases)"
        self.step_starts: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.end_time = 0.0

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def step_start(self) -> None:
        self.step_starts.append(self._now())
        self.phases.append({})

    def finish(self) -> None:
        self.end_time = self._now()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self._now()
        yield
        current = self.phases[-1]
        current[name] = current.get(name, 0.0) + (self._now() - start) * 1e3

    host_phase = phase

    def step_ms(self) -> list[float]:
        edges = self.step_starts + [self.end_time]
        return [(b - a) * 1e3 for a, b in zip(edges, edges[1:])]

    def phase_ms(self) -> list[dict[str, float]]:
        return self.phases


class CudaEventTimer:
    """CUDA events recorded in stream order; read only after the trial's final synchronize.

    Step latency is the interval between consecutive step-start events on the stream, so it covers
    GPU work and any idle time the GPU spent waiting for the host.
    """

    method = ("CUDA events on the current stream, read after the trial (no host sync inside the loop); "
              "data wait by host clock")

    def __init__(self, device: torch.device):
        self.step_events: list[torch.cuda.Event] = []
        self.phase_events: list[list[tuple[str, torch.cuda.Event, torch.cuda.Event]]] = []
        self.host_phases: list[dict[str, float]] = []
        self.end_event = torch.cuda.Event(enable_timing=True)

    @staticmethod
    def _record() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step_start(self) -> None:
        self.step_events.append(self._record())
        self.phase_events.append([])
        self.host_phases.append({})

    def finish(self) -> None:
        self.end_event.record()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self._record()
        yield
        self.phase_events[-1].append((name, start, self._record()))

    @contextmanager
    def host_phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        current = self.host_phases[-1]
        current[name] = current.get(name, 0.0) + (time.perf_counter() - start) * 1e3

    def step_ms(self) -> list[float]:
        edges = self.step_events + [self.end_event]
        return [a.elapsed_time(b) for a, b in zip(edges, edges[1:])]

    def phase_ms(self) -> list[dict[str, float]]:
        steps = []
        for events, host in zip(self.phase_events, self.host_phases):
            phases = dict(host)
            for name, start, end in events:
                phases[name] = phases.get(name, 0.0) + start.elapsed_time(end)
            steps.append(phases)
        return steps


def make_timer(device: torch.device, sync_phases: bool):
    if device.type == "cuda" and not sync_phases:
        return CudaEventTimer(device)
    return HostClockTimer(device, sync=sync_phases)

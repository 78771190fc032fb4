"""Steady state before timing: use up what the DataLoader prepared during warm-up, then size trials by time.

With DataLoader workers, warm-up leaves the loader's queue full (workers x prefetch factor batches) and
its workers just started. A trial that begins there is partly served from that queue, so a loader-bound
run looks faster in its first trial than in the others (25-45% spread between trials measured on the
H100 before this). `reach_steady_state` runs untimed windows of steps until two consecutive windows take
the same time per step; `steps_for_time` then makes each trial last long enough that the loader's
burstiness averages out, and a whole number of the loader's cycles long.

Why whole cycles: a DataLoader hands batch i to worker i mod W and returns batches in order, so once steady,
a loader-bound run's step times repeat with a period of W steps (workers that started together deliver in
waves: W batches close together, then a wait). A trial of any W x m consecutive steps holds m batches of every
worker and takes the same time wherever in the cycle it starts; a trial of 34 steps at 16 workers spans two
waits or three depending on where it starts. The drain windows are W x prefetch factor steps, whole cycles too.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from perflab.harness.loop import run_steps
from perflab.step.timers import NullTimer
from perflab.results.metrics import Metrics

SETTLED_TOLERANCE = 0.10  # consecutive windows within 10% per step: steady
MAX_WINDOWS = 8
MAX_DRAIN_S = 30.0
UNSTEADY_RANGE_PCT = 10.0  # trials whose throughput range exceeds this are reported as not steady


def reach_steady_state(plan, batches: Iterator[Any], queued: int, synchronize: Callable[[], None],
                       agree: Callable[[bool], bool] = lambda stop: stop) -> dict[str, Any]:
    """Untimed windows of `queued` steps (at least 4) until the time per step settles; what it took.

    `agree` turns this process's wish to stop into the decision of every process that steps together (the
    ranks of a distributed run must run the same number of steps)."""
    window = max(queued, 4)
    per_step_s: list[float] = []
    began = time.perf_counter()
    settled = False
    while True:
        start = time.perf_counter()
        run_steps(plan, batches, window, NullTimer())
        synchronize()
        per_step_s.append((time.perf_counter() - start) / window)
        settled = len(per_step_s) >= 2 and abs(per_step_s[-1] - per_step_s[-2]) <= SETTLED_TOLERANCE * per_step_s[-2]
        out_of_budget = len(per_step_s) >= MAX_WINDOWS or time.perf_counter() - began >= MAX_DRAIN_S
        if agree(settled or out_of_budget):
            break
    return {"steps": window * len(per_step_s), "seconds": time.perf_counter() - began,
            "step_s": per_step_s[-1], "settled": settled, "window_step_ms": [1e3 * s for s in per_step_s]}


def steps_for_time(steps: int, step_s: float, min_trial_s: float, cycle: int = 1) -> int:
    """At least `steps`, enough steps of `step_s` for a trial to last `min_trial_s`, and a multiple of `cycle`
    (the loader's worker count: whole cycles of its round robin); exactly `steps` when `min_trial_s` is 0."""
    if min_trial_s <= 0:
        return steps
    wanted = max(steps, math.ceil(min_trial_s / step_s)) if step_s > 0 else steps
    cycle = max(1, cycle)
    return cycle * math.ceil(wanted / cycle)


def moving_phase(trial_phase_ms: Sequence[dict[str, float]]) -> Optional[dict[str, Any]]:
    """The phase whose mean ms per step moved most between trials, when it carries most of the movement.

    On the H100, loader-fed trials that disagreed by 10-28% kept forward, backward and optimizer fixed while the
    data wait moved (2.5 -> 4.4 ms per step): the host made batches at a drifting rate. Naming the phase tells
    the user where the unsteadiness lives (the input pipeline and the host, or the device). None when fewer than
    two trials have phases, or when no single phase moved more than all the others together."""
    trials = [phases for phases in trial_phase_ms if phases]
    if len(trials) < 2:
        return None
    names = sorted({name for phases in trials for name in phases})
    moves = {name: [phases.get(name, 0.0) for phases in trials] for name in names}
    ranges = {name: max(values) - min(values) for name, values in moves.items()}
    phase = max(ranges, key=ranges.get)
    others = sum(moved for name, moved in ranges.items() if name != phase)
    if ranges[phase] <= 0 or ranges[phase] <= others:
        return None
    steady_phases = {name: round(moved, 3) for name, moved in ranges.items() if name != phase}
    return {"phase": phase, "low_ms": min(moves[phase]), "high_ms": max(moves[phase]),
            "other_phases_range_ms": steady_phases}


def trend(throughputs: Sequence[float], min_trials: int = 4) -> Optional[dict[str, Any]]:
    """Trials whose throughput only falls (or only rises) from first to last: a drift, not noise around a level.

    On the H100, driving at 8 workers ran 227, 221, 209, 201, 207 samples/s and augment with per-sample CPU
    augmentation 661, 652, 626, 602, 593 in five consecutive trials: the spread was a fall, which more trials
    do not average out. Here a drift is at least `min_trials` trials, each of the first ones past the last (all
    but one step in the same direction) and the last more than UNSTEADY_RANGE_PCT / 2 from the first. None
    otherwise."""
    values = list(throughputs)
    if len(values) < min_trials or not values[0]:
        return None
    steps = [after - before for before, after in zip(values, values[1:])]
    falls, rises = sum(step < 0 for step in steps), sum(step > 0 for step in steps)
    change_pct = 100 * (values[-1] - values[0]) / values[0]
    direction = "falls" if falls >= len(steps) - 1 and change_pct < 0 else \
        "rises" if rises >= len(steps) - 1 and change_pct > 0 else None
    if direction is None or abs(change_pct) <= UNSTEADY_RANGE_PCT / 2:
        return None
    return {"direction": direction, "first": values[0], "last": values[-1], "change_pct": change_pct}


def steady_notes(steady: dict[str, Any], steps_per_trial: int, cfg) -> list[str]:
    """The run's notes on reaching a steady state and on trials sized by time."""
    notes = [f"before timing, {steady['steps']} untimed steps used up the DataLoader's prefilled queue "
             f"({'settled' if steady['settled'] else 'NOT settled'} at {1e3 * steady['step_s']:.1f} ms/step)"]
    if steps_per_trial > cfg.steps:
        cycles = f", whole cycles of its {cfg.workers} workers" if cfg.workers > 1 else ""
        notes.append(f"trials sized by time: {steps_per_trial} steps each (at least {cfg.min_trial_s:g} s"
                     f"{cycles}; --steps {cfg.steps} would be shorter), because the DataLoader feeds this run")
    return notes


def unsteady_note(metrics: Metrics) -> Optional[str]:
    """One line for a run whose trials disagree (naming the phase that moved, when one did); None if steady."""
    if metrics.steady:
        return None
    spread = metrics.throughput_samples_per_s.range_pct
    note = (f"trials disagree by {spread:.0f}% (more than {UNSTEADY_RANGE_PCT:g}%): this run is not steady; use "
            "more --trials, longer trials (--steps, --min-trial-s) or a quieter machine before trusting a change")
    drift = metrics.throughput_trend
    if drift is not None:
        note += (f". Throughput {drift.direction} trial after trial ({drift.first:.4g} -> {drift.last:.4g}, "
                 f"{drift.change_pct:+.0f}%): a drift, which more trials do not average out (a host that slows "
                 "under sustained load, or state that grows over the run)")
    moved = metrics.unsteady_phase
    if moved is None:
        return note
    where = ("the input pipeline's rate drifts between trials (DataLoader workers and the host CPU), not the model"
             if moved.phase == "data_wait" else f"the {moved.phase} phase is what varies")
    return (f"{note}. The {moved.phase} phase moved between {moved.low_ms:.2f} and {moved.high_ms:.2f} ms "
            f"per step while the other phases moved less: {where}")

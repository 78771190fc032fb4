"""Which levers to try next, in which order, and with which values (numeric knobs are searched, not guessed).

A confident diagnosis (its verdict at UNSURE_BELOW or above) leads with the finding it named: that finding's
levers first, then the other levers that address the same bottleneck class. Where the diagnosis is unsure (or
names no bottleneck), every finding is weighed by the gain to expect from it, the share of the step it
explains (`expected_gain_pct`) times its confidence, or by confidence alone when no share is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from perflab import options
from perflab.bottlenecks import NO_CLEAR_BOTTLENECK
from perflab.config import RunConfig
from perflab.environment import usable_cpus  # noqa: F401  (where the tune driver reads it)
from perflab.levers import COMPILES, Lever
from perflab.levers.compile import MODES as COMPILE_MODE_HINTS  # each mode's cost_scale
from perflab.workloads import load_workload

UNSURE_BELOW = 0.7  # a verdict less confident than this: try the next most likely levers too
BATCH_LEVER = "batch-size"  # not a lever of perflab.levers: searched only with --tune-batch

ONCE, LADDER, ALTERNATIVES, BATCH = "once", "ladder", "alternatives", "batch"
# A ladder stops after this many rungs in a row that did not win, not at the first: on the H100, driving at
# 2 DataLoader workers ran 30% slower than in the main process (whose augmentations use 16 threads; a worker
# uses one), while 8 workers were its hand-found best.
LADDER_PATIENCE = 2


@dataclass(frozen=True)
class Proposal:
    """A lever the diagnosis (or its fallback) proposes, with the finding behind it."""

    lever: str
    source: str  # the bottleneck class of the finding that proposed it, or "fallback"
    confidence: Optional[float]
    # the share of the step the lever may remove: the finding's share (when the diagnosis says) times what the
    # lever can take away of its class's time (Lever.removes)
    expected_share_pct: Optional[float]
    named: bool = True  # the finding named it (False: it only addresses the finding's class, or the fallback)


@dataclass(frozen=True)
class Candidate:
    """One trial to make: the current best with one option changed."""

    proposal: Proposal
    option: str  # the RunConfig field
    value: Any
    search: str  # once | ladder | alternatives | batch
    also: tuple[tuple[str, Any], ...] = ()  # options changed with it (checkpointing with a larger batch: one pair)
    warmup: int = 0  # the warm-up steps its value needs before its steps are steady (ValueHints.warmup)

    @property
    def lever(self) -> str:
        return self.proposal.lever

    @property
    def label(self) -> str:
        if self.also:
            return "+".join([self.lever, *(f"{option.replace('_', '-')}={value}" for option, value in self.also)])
        if self.search == ONCE:
            return self.lever
        return f"{self.lever}={'default' if self.value is None else self.value}"

    def apply(self, cfg: RunConfig) -> RunConfig:
        """cfg with the candidate's option changed, and at least the warm-up its value needs (a compile mode's
        compilation, and with CUDA graphs their recording, stays out of the timed steps)."""
        changed = cfg.replace(**{self.option: self.value, **dict(self.also)})
        return changed.replace(warmup=self.warmup) if changed.warmup < self.warmup else changed


def _field(finding: Any, name: str) -> Any:
    return finding.get(name) if isinstance(finding, dict) else getattr(finding, name, None)


def ordered_findings(findings: Iterable[Any]) -> list[Any]:
    """Findings by the gain to expect from each: the share of the step it explains times how sure it is (when
    every finding gives a share), else by confidence alone."""
    findings = list(findings)
    if findings and all(_field(f, "expected_gain_pct") is not None for f in findings):
        return sorted(findings, key=lambda f: -_field(f, "expected_gain_pct") * (_field(f, "confidence") or 0.0))
    return sorted(findings, key=lambda f: -(_field(f, "confidence") or 0.0))


def proposals(diagnosis: Any, levers_by_name: dict[str, Any], unsure_below: float = UNSURE_BELOW) -> list[Proposal]:
    """The levers to try, best first: the leading finding's, then every lever addressing its class; where the
    diagnosis is unsure, the other findings' too; with no bottleneck named, every lever after those."""
    findings = ordered_findings(_field(diagnosis, "findings") or [])
    confidence = _field(diagnosis, "confidence") or 0.0
    unsure = confidence < unsure_below or not findings or _field(diagnosis, "bottleneck") == NO_CLEAR_BOTTLENECK
    chosen: dict[str, Proposal] = {}

    def add(name: str, finding: Any, named: bool = False) -> None:
        if name not in chosen and name in levers_by_name:
            source = _field(finding, "cls") if finding is not None else "fallback"
            share = _field(finding, "expected_gain_pct") if finding is not None else None
            if share is not None:
                share *= levers_by_name[name].removes(source)
            chosen[name] = Proposal(name, source, _field(finding, "confidence") if finding is not None else None,
                                    share, named)

    # A confident diagnosis leads with the finding it named; an unsure one is weighed finding by finding.
    named = [f for f in findings if _field(f, "cls") == _field(diagnosis, "bottleneck")]
    considered = findings if unsure else (named or findings)[:1]
    for finding in considered:
        for name in _field(finding, "levers") or []:
            add(name, finding, named=True)
    for finding in considered:  # then the other levers for the same bottleneck classes
        for lever in levers_by_name.values():
            if _field(finding, "cls") in lever.classes:
                add(lever.name, finding)
    if not findings or _field(diagnosis, "bottleneck") == NO_CLEAR_BOTTLENECK:
        for lever in levers_by_name.values():  # nothing named: every lever, in application order
            add(lever.name, None)
    return list(chosen.values())


def predicted_gain_pct(share_pct: Optional[float]) -> Optional[float]:
    """Throughput gain if a share of the step vanished entirely: 1 / (1 - share) - 1."""
    if share_pct is None:
        return None
    share = min(max(share_pct, 0.0), 99.0) / 100
    return 100 * (1 / (1 - share) - 1)


def ladder_rungs(lever: Any, current: Any, cpu_count: int) -> list[int]:
    """The rungs of the lever's ladder (TuneHints.ladder) above the current value, or above what an unset option
    means (TuneHints.unset_means)."""
    floor = current if current is not None else lever.tune.unset_means
    return [n for n in lever.tune.ladder(cpu_count) if floor is None or n > floor]


def ordered_values(lever: Any, proposal: Proposal, best: RunConfig) -> list[Any]:
    """The lever's values (TuneHints.values) in the order to try them: the first leads; then those that lead for
    the proposal's bottleneck class; then the rest as declared. Off CUDA, the values tried on CUDA only are left out."""
    first, *rest = lever.tune.values
    rest = [value for value in rest if best.device == "cuda" or not lever.tune.hints_for(value).cuda_only]
    return [first, *sorted(rest, key=lambda value: proposal.source not in lever.tune.hints_for(value).leads_for)]


def covered_by_kept(candidate: Candidate, lever: Any, best: RunConfig) -> Optional[str]:
    """Why the candidate's value adds nothing to the value its option holds in the best (ValueHints.covered_by:
    compile=reduce-overhead after a kept max-autotune), or None."""
    if lever is None:
        return None
    kept = getattr(best, candidate.option)
    why = dict(lever.tune.hints_for(candidate.value).covered_by).get(kept)
    return f"{candidate.option.replace('_', '-')}={kept} (kept) {why}" if why else None


def compiles(lever: Optional[Lever]) -> bool:
    """Whether a lever's trial compiles the model (TuneHints.cost COMPILES): its cost is estimated before it runs."""
    return lever is not None and lever.tune.cost == COMPILES


def measures_compile_cost(candidate: Candidate, lever: Optional[Lever]) -> bool:
    """Whether the candidate is a compiling lever's leading value (compile=default, cost_scale 1): the one whose
    trial measures what compiling adds, from which the other values' costs are estimated."""
    return compiles(lever) and bool(lever.tune.values) and candidate.value == lever.tune.values[0]


def compile_trial_cost_s(mode: str, plain_trial_s: float, measured_extra_s: Optional[float]) -> Optional[float]:
    """Expected wall time of a trial in a compile mode: a plain trial plus what compiling adds, scaled by the
    mode's cost_scale (perflab/levers/compile.py) from what a compile=default trial measurably added (its
    compilation and warm-up; the trials share the Inductor caches, so a configuration compiled before costs less).
    Before any compile was measured: a plain trial for default (its trial is the measurement, stopped at the budget
    left), None (unknown) for the other modes."""
    if measured_extra_s is not None:
        return plain_trial_s + measured_extra_s * COMPILE_MODE_HINTS[mode].cost_scale
    return plain_trial_s if mode == "default" else None


def compile_over_budget(mode: str, plain_s: float, extra_s: Optional[float], left_s: float) -> Optional[str]:
    """Why a compile mode's trial does not fit in the budget left (with the estimate it was judged by), or None."""
    cost = compile_trial_cost_s(mode, plain_s, extra_s)
    if cost is None:
        return (f"its compile time is unknown: compile=default, whose compile time {mode}'s is estimated from, "
                "did not finish")
    if cost <= left_s:
        return None
    scale = COMPILE_MODE_HINTS[mode].cost_scale
    basis = (f"{scale:g}x the {extra_s:.0f} s that compile=default added to a {plain_s:.0f} s trial"
             if extra_s is not None else f"a {plain_s:.0f} s trial")
    return f"needs about {cost:.0f} s ({basis}) and {left_s:.0f} s of the budget is left"


@dataclass
class CompileCost:
    """What compiling adds to a trial, once compile=default's first trial measured it: the estimate of every later
    compile trial (each mode's cost_scale)."""

    plain_trial_s: Optional[float] = None  # the trial compile=default was read against
    extra_s: Optional[float] = None  # what compile=default's trial took beyond it

    def measured(self, plain_trial_s: float, compiled_trial_s: float) -> None:
        """Record compile=default's trial against the plain one it was read against (the first measurement holds)."""
        if self.extra_s is None:
            self.plain_trial_s, self.extra_s = plain_trial_s, max(0.0, compiled_trial_s - plain_trial_s)

    def trial_s(self, mode: str, plain_trial_s: float) -> Optional[float]:
        """Expected wall time of a trial in `mode` (None: unknown before compile=default finished)."""
        return compile_trial_cost_s(mode, plain_trial_s, self.extra_s)

    def over_budget(self, mode: str, best_trial_s: float, left_s: float) -> Optional[str]:
        """Why a full trial in `mode` does not fit in `left_s`, or None."""
        plain_s = self.plain_trial_s if self.plain_trial_s is not None else best_trial_s
        return compile_over_budget(mode, plain_s, self.extra_s, left_s)


def expand(proposal: Proposal, lever: Any, best: RunConfig, cpu_count: int) -> list[Candidate]:
    """The candidates a lever stands for: its one value, or the values of a numeric or mode search."""
    current = getattr(best, lever.option)
    if lever.tune.ladder is not None:
        return [Candidate(proposal, lever.option, n, LADDER) for n in ladder_rungs(lever, current, cpu_count)]
    if lever.tune.values:
        return [Candidate(proposal, lever.option, value, ALTERNATIVES, warmup=lever.tune.hints_for(value).warmup)
                for value in ordered_values(lever, proposal, best) if value != current]
    if lever.option == "pin_memory" and best.pins_memory(best.device):
        return []  # pinned already (unset means pinned on CUDA): the candidate would measure the same config
    if lever.value is None or lever.is_active(best):
        return []
    return [Candidate(proposal, lever.option, lever.value, ONCE)]


def bisect_batch(good: int, out_of_memory: int) -> Optional[int]:
    """The batch between the largest that ran and the smallest that ran out of memory; None when adjacent
    enough (within an eighth of the good one)."""
    middle = (good + out_of_memory) // 2
    if out_of_memory - good <= max(1, good // 8) or middle in (good, out_of_memory):
        return None
    return middle


class WorkloadBuilds:
    """The workloads a tune builds for the levers' refusals, on the CPU (no CUDA context in the tuning process): the
    starting point's (once) and, to confirm a refusal, one per candidate's settings (cached). `check` False: none is
    built and `given` (or None) stands for every one."""

    def __init__(self, start: RunConfig, given: Any = None, check: bool = True):
        self.start, self.given, self.check = start, given, check
        self.built_for: dict[str, Any] = {}

    def for_config(self, cfg: Optional[RunConfig] = None) -> Any:
        """The workload built for the starting point (`cfg` None) or for `cfg`'s settings."""
        if not self.check:
            return self.given
        if cfg is None:
            if self.given is None:
                self.given = load_workload(self.start.workload, self.start)
            return self.given
        key = repr(cfg.replace(out=None))
        if key not in self.built_for:
            self.built_for[key] = load_workload(cfg.workload, cfg)
        return self.built_for[key]


def refusal_before_trying(candidate: Candidate, cfg: RunConfig, lever: Any,
                          workload_for: Callable[[Optional[RunConfig]], Any]) -> Optional[str]:
    """Why the candidate cannot run here, known without running it: the option table's rules on this device
    (needs CUDA, mode, conflicts), then the lever's own checks of the workload.

    `workload_for(None)` is the workload built for the starting point (None when tune does not check), and
    `workload_for(cfg)` one built for the candidate's own settings. For an option a workload's build reads
    (`read_by_build` in the option table: driving sets its batched gpu_augment only when built with augment=gpu),
    a lever's refusal on the first is confirmed on the second; other refusals need no second build (a user's
    build may take minutes).

    The checks get a CPU device: the one check that reads the GPU (bf16 support) would create a CUDA context
    in the tuning process, and every trial would then count that process as a neighbour on its GPU (a busy,
    unjudged measurement). A child that finds bf16 unsupported refuses it itself.
    """
    reason = options.refusal(cfg, candidate.option, cfg.device)
    if reason is not None or lever is None:
        return reason
    shared = workload_for(None)
    if shared is None:
        return None
    reason = lever.checks(cfg, shared, torch.device("cpu"))
    if reason is None or not options.option_named(RunConfig, candidate.option).read_by_build:
        return reason
    return lever.checks(cfg, workload_for(cfg), torch.device("cpu"))

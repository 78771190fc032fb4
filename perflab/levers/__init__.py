"""Levers: named, composable optimisations. Each module defines LEVERS, a list of Lever objects.

A lever is one value of one run option; the option's declaration in RunConfig says when it is on, its
flag, whether it needs CUDA or a mode and what it conflicts with. The lever adds what only it knows, each
fact declared once, here and nowhere else: what it needs of the workload, which bottleneck classes it
addresses (and where each class's rule ranks it), how it edits the StepPlan, the change a script's author
makes in code instead, what is left to do when it loses, and how tune orders its trial. Diagnosis rules,
tune, the script advice and `perflab levers` read these declarations; tests/test_lever_facts.py checks that
every lever declares every fact. `check_levers` checks every active lever before any of them runs, so a
refused lever stops the run before anything is measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

import torch

from perflab import options
from perflab.config import RunConfig
from perflab.errors import PerflabError

Refusal = Callable[..., Optional[str]]

# How much one trial of a lever costs tune (TuneHints.cost)
ONE_TRIAL = "one plain trial"
COMPILES = "a trial that compiles the model (tens of seconds to minutes)"
# Where a data-path lever acts (TuneHints.data_path): tune moves per-item work off the host before it tunes the
# loader's queue, since while the loader is the limit a deeper queue, pinning or a copy stream change nothing.
DEVICE_WORK = "moves the per-item work from the host to the device"
LOADER_QUEUE = "tunes the loader's queue or its copies"


@dataclass(frozen=True)
class Address:
    """A bottleneck class a lever addresses. `rank`: where the class's rule names the lever (lower first), or
    None: the rule does not name it, and tune tries it after the named levers. `when`: a situation
    (perflab.bottlenecks) the rule must report for it to name the lever; a lever may hold two addresses of one
    class with different situations (and ranks). `removes`: the most of the class's time the lever can take away
    (tune's predicted gain is the finding's share of the step times this): bf16 on a bandwidth-bound step halves
    the bytes, it does not make them vanish."""

    cls: str
    rank: Optional[int] = None
    when: Optional[str] = None
    removes: float = 1.0


@dataclass(frozen=True)
class ValueHints:
    """What tune knows of one value among a lever's values (TuneHints.values): what its trial costs, the warm-up it
    needs, where it is worth trying and when it comes early."""

    cost_scale: float = 1.0  # what its trial adds to a plain one, relative to the first value's measured addition
    warmup: int = 0  # warm-up steps it needs before its steps are steady (0: the run's own are enough)
    cuda_only: bool = False  # tune tries it on CUDA only (what it adds is a CUDA feature: CUDA graphs, GPU kernels)
    leads_for: tuple[str, ...] = ()  # bottleneck classes for which it is tried right after the first value
    # (kept value, why): values of the option that already give what this one adds; tune does not try it after them
    covered_by: tuple[tuple[Any, str], ...] = ()


NO_VALUE_HINTS = ValueHints()


@dataclass(frozen=True)
class TuneHints:
    """What tune reads (perflab/tune/ordering.py, candidates.py): the cost of a trial, the lever tried at once when
    this one is kept (its partner: one win measured in two trials), where on the data path it acts, how far it
    reduces the arithmetic among its option's values (a value is tried only above the current one's), and the
    values it searches (alternatives, or the rungs of a ladder)."""

    cost: str  # ONE_TRIAL or COMPILES
    partner: Optional[str] = None  # a lever name
    data_path: Optional[str] = None  # DEVICE_WORK, LOADER_QUEUE or None
    tier: Optional[int] = None  # --precision: tf32 1, bf16 and fp16 2 (fp32, which is no lever, 0)
    # A big one-flag lever (9-11x seen from one flag): tune screens it whether or not the diagnosis names it, in
    # this order among such levers (perflab/tune/screening.py); None: screened only when proposed.
    screen_always: Optional[int] = None
    # A numeric option's values for tune to try, each in its own trial (the DDP bucket size, FSDP's prefetch depth,
    # compile's modes; the first leads); empty: the lever's one value (or its ladder).
    values: tuple = ()
    per_value: Mapping[Any, ValueHints] = field(default_factory=dict, hash=False)  # a value not named: NO_VALUE_HINTS
    # A numeric option tune climbs rung by rung while it pays (workers, prefetch factor): the rungs on a machine with
    # this many CPUs; tune tries those above the current value, or above `unset_means` when the option is not given.
    ladder: Optional[Callable[[int], Sequence[int]]] = None
    unset_means: Any = None

    def hints_for(self, value: Any) -> ValueHints:
        """What tune knows of `value` of this lever's option."""
        return self.per_value.get(value, NO_VALUE_HINTS)


@dataclass(frozen=True)
class Lever:
    """A lever is one value of one run option (RunConfig field `option`); the option's declaration says its
    flag, whether it needs CUDA or a mode, what it conflicts with and whether it changes numerics. The rest of
    its facts are declared here (see the module docstring)."""

    name: str  # the name diagnosis uses to propose it, e.g. "channels-last"
    option: str  # the RunConfig field that switches it on
    value: Any  # the option's value that is this lever; None: any value that sets the option
    summary: str
    needs: str  # human text: what it requires
    addresses: tuple[Address, ...]  # bottleneck classes, as the diagnosis names them (docs/diagnose.md)
    order: int  # application order: data path < precision < layout < optimizer < compile < graphs
    apply: Callable  # (plan, cfg) -> None
    in_code: str  # the same change made in a script's own code (`perflab run -- python script.py` advice)
    when_lost: str  # what its loss teaches: the cost it left in place, and what acts on that
    tune: TuneHints
    checks: Refusal = field(default=lambda *_: None)  # what the option table cannot know (the workload, ...)
    # True: a tune trial with this lever runs in a fresh process, not tune's warm worker (perflab/tune/warm.py): the
    # lever starts processes of its own (DataLoader workers, ranks) or changes what a process keeps for good.
    changes_process: bool = False

    @property
    def classes(self) -> tuple[str, ...]:
        """The bottleneck classes it addresses, each once, in declaration order."""
        return tuple(dict.fromkeys(address.cls for address in self.addresses))

    def rank_for(self, cls: str, situations: Collection[str], always: bool = True) -> Optional[int]:
        """Where the rule for `cls` names this lever when `situations` hold, or None when it does not name it.
        always=False: only an address that asks for one of `situations` counts (not one that asks for none)."""
        for address in self.addresses:
            if address.cls != cls or address.rank is None:
                continue
            if address.when in situations or (always and address.when is None):
                return address.rank
        return None

    def removes(self, cls: str) -> float:
        """The most of `cls`'s time this lever can take away (Address.removes; 1.0 where it does not say)."""
        return max((address.removes for address in self.addresses if address.cls == cls), default=1.0)

    @property
    def declared(self) -> options.Option:
        return options.option_named(RunConfig, self.option)

    @property
    def flag(self) -> str:
        """How to switch it on from the command line."""
        return self.declared.flag_for(self.value)

    def is_active(self, cfg) -> bool:
        value = getattr(cfg, self.option)
        return options.is_set(self.declared, value) if self.value is None else value == self.value

    @property
    def changes_numerics(self) -> bool:
        """True: outputs may differ from fp32 eager, so the quality gate runs."""
        return self.declared.value_changes_numerics(self.value if self.value is not None else True)

    @property
    def needs_cuda(self) -> bool:
        return self.declared.value_needs_cuda(self.value if self.value is not None else True)

    def refusal(self, cfg, workload, device: torch.device) -> Optional[str]:
        """Why this lever cannot run here, or None: the option table's rules, then the lever's own checks."""
        return options.refusal(cfg, self.option, device.type) or self.checks(cfg, workload, device)


def all_levers() -> list[Lever]:
    """Every lever perflab knows, in application order."""
    # the registry: every family module imports this one (Lever, Address, ...), so they are loaded on first use
    from perflab.levers import (compile, cuda_graphs, cudnn, data_path, distributed, generation, memory_format,  # noqa: I001, registry
                                optimizer, precision, prefetcher)
    modules = [data_path, prefetcher, precision, memory_format, cudnn, optimizer, distributed, compile, cuda_graphs,
               generation]
    modules += _optional_modules()
    levers = [lever for module in modules for lever in module.LEVERS]
    return sorted(levers, key=lambda lever: lever.order)


def _optional_modules() -> list:
    """Lever modules that ship with the workloads that need them (augment, pipeline, checkpointing, sdpa)."""
    import importlib
    found = []
    for name in ("augment", "pipeline", "checkpointing", "sdpa"):
        try:
            found.append(importlib.import_module(f"perflab.levers.{name}"))
        except ModuleNotFoundError as err:
            if err.name != f"perflab.levers.{name}":
                raise
    return found


def levers_for(cls: str, situations: Collection[str] = (), always: bool = True) -> list[str]:
    """The names of the levers the rule for `cls` names when `situations` hold, best first (by declared rank;
    equal ranks in application order). always=False: only the levers whose address asks for one of
    `situations` (the decode rule names the levers of its regime, not every lever of the class)."""
    ranked = [(lever.rank_for(cls, situations, always), index, lever.name)
              for index, lever in enumerate(all_levers())]
    return [name for rank, _, name in sorted(entry for entry in ranked if entry[0] is not None)]


def lever_names() -> list[str]:
    return [lever.name for lever in all_levers()]


def active_levers(cfg) -> list[Lever]:
    return [lever for lever in all_levers() if lever.is_active(cfg)]


def process_changing_levers(cfg) -> list[str]:
    """The names of cfg's active levers that need a fresh process (Lever.changes_process)."""
    return [lever.name for lever in active_levers(cfg) if lever.changes_process]


def check_levers(cfg, workload, device: torch.device) -> list[Lever]:
    """The active levers, or PerflabError with the first refusal's reason (options that are not levers,
    such as --checkpoint-every, are checked against the option table too)."""
    levers = active_levers(cfg)
    lever_options = {lever.option for lever in levers}
    for declared in options.options_of(RunConfig):
        value = getattr(cfg, declared.name)
        if declared.name not in lever_options and options.is_set(declared, value):
            reason = options.refusal(cfg, declared.name, device.type)
            if reason:
                raise PerflabError(f"{declared.flag_for(value)} refused: {reason}")
    for lever in levers:
        reason = lever.refusal(cfg, workload, device)
        if reason:
            raise PerflabError(f"{lever.flag} refused: {reason}")
    return levers


def cuda_only_levers() -> set[str]:
    """Names of the levers that need a CUDA GPU (never proposed for a CPU run)."""
    return {lever.name for lever in all_levers() if lever.needs_cuda}


def apply_levers(plan, cfg, levers: list[Lever]) -> None:
    for lever in levers:
        lever.apply(plan, cfg)
        plan.levers.append(lever.name)


def first_refusal(*refusals: Refusal) -> Refusal:
    """Checks run in order; the first reason wins."""
    def refusal(cfg, workload, device) -> Optional[str]:
        for check in refusals:
            reason = check(cfg, workload, device)
            if reason:
                return reason
        return None
    return refusal

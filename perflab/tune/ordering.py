"""Tune's order of the proposed levers: cheap levers and the levers that pair with one already kept come first.

The diagnosis ranks levers by what they address; tune also pays for each try, so it rearranges that ranking:

- layout follows precision: on a model with convolutions, channels-last goes right after bf16/fp16 (or first,
  once one of them is kept). cuDNN's Tensor Core convolutions want NHWC in reduced precision; in NCHW a bf16
  network spends its time in layout transposes, so the two are one win measured in two trials (once bf16 is
  kept, channels-last leads its finding's levers, and it is tried at once, before the re-profile);
- the per-item work leaves the host before the queue is tuned: augment-gpu goes before prefetch-factor,
  persistent-workers, prefetcher-stream and pin-memory (workers, when proposed, stays first). While the
  loader is the limit, a deeper queue, pinning or a copy stream change nothing measurable (BENCHMARKS.md,
  "driving: each data-path lever"); moving the transforms to the device does;
- compilation comes after the cheap levers the same finding named: a compile trial costs one or two compilations
  (tens of seconds to minutes), so it must not crowd out levers that cost one plain trial. Compile is still
  tried in the same round, and it is as effective after them as before them.

Which lever is which is declared once, in each lever's TuneHints (perflab/levers): its cost (COMPILES), its
partner, and where on the data path it acts (DEVICE_WORK, LOADER_QUEUE).

A lever that would replace one already kept instead of adding to it (tf32 after bf16 was kept: both are values of
--precision) is not a candidate at all: `replaces_kept` says why.
"""
from __future__ import annotations

from typing import Any, Optional

from perflab.config import RunConfig
from perflab.levers import COMPILES, DEVICE_WORK, LOADER_QUEUE, Lever, all_levers


def _levers() -> dict[str, Lever]:
    return {lever.name: lever for lever in all_levers()}


def partner_of(name: str) -> Optional[str]:
    """The lever tried at once, before the re-profile, when `name` is kept (what the kept lever needs), or None."""
    lever = _levers().get(name)
    return lever.tune.partner if lever is not None else None


def arrange(proposals: list[Any], best: RunConfig) -> list[Any]:
    """The proposals in the order tune tries them (see the module docstring; each lever's TuneHints say which
    rule moves it)."""
    levers = _levers()
    order = list(proposals)
    for partner in dict.fromkeys(lever.tune.partner for lever in levers.values() if lever.tune.partner):
        order = _partner_after_its_lever(order, partner, levers, best)
    order = _device_work_before_queue(order, levers)
    return _compiling_after_cheap_levers(order, levers)


def _names(order: list[Any]) -> list[str]:
    return [proposal.lever for proposal in order]


def _with_hint(names: list[str], levers: dict[str, Lever], **hint: Any) -> list[str]:
    """The names (in order) whose lever's TuneHints hold each of `hint`'s values."""
    return [name for name in names if name in levers
            and all(getattr(levers[name].tune, key) == value for key, value in hint.items())]


def _move(order: list[Any], lever: str, index: int) -> list[Any]:
    """`order` with `lever` moved to position `index` (of the list without it)."""
    moving = next(proposal for proposal in order if proposal.lever == lever)
    rest = [proposal for proposal in order if proposal.lever != lever]
    return rest[:index] + [moving] + rest[index:]


def _partner_after_its_lever(order: list[Any], partner: str, levers: dict[str, Lever],
                             best: RunConfig) -> list[Any]:
    """A partner (channels-last) goes right after the first lever it pairs with (bf16/fp16), or, once one of those
    is kept, first among the levers of the finding that proposed it."""
    names = _names(order)
    if partner not in names:
        return order
    pairs = [lever for lever in levers.values() if lever.tune.partner == partner]
    if any(lever.is_active(best) for lever in pairs):
        source = order[names.index(partner)].source
        return _move(order, partner, next(index for index, proposal in enumerate(order) if proposal.source == source))
    proposed = [name for name in names if name in {lever.name for lever in pairs}]
    if not proposed:
        return order
    rest = [name for name in names if name != partner]
    return _move(order, partner, rest.index(proposed[0]) + 1)


def _device_work_before_queue(order: list[Any], levers: dict[str, Lever]) -> list[Any]:
    """A lever that moves the per-item work to the device (augment-gpu) moves before the first loader-queue lever
    (workers, searched first, stays ahead of it)."""
    for mover in _with_hint(_names(order), levers, data_path=DEVICE_WORK):
        names = _names(order)
        queue = [names.index(name) for name in _with_hint(names, levers, data_path=LOADER_QUEUE)]
        if queue and min(queue) < names.index(mover):
            order = _move(order, mover, min(queue))
    return order


def _compiling_after_cheap_levers(order: list[Any], levers: dict[str, Lever]) -> list[Any]:
    """Each lever whose trial compiles moves behind the last cheap lever the same finding named (not behind the
    levers that merely address its class: those are the next most likely, not the finding's advice)."""
    for lever in _with_hint(_names(order), levers, cost=COMPILES):
        names = _names(order)
        source = order[names.index(lever)].source
        rest = [proposal for proposal in order if proposal.lever != lever]
        same = [index for index, proposal in enumerate(rest) if proposal.source == source and proposal.named]
        if same and same[-1] >= names.index(lever):
            order = _move(order, lever, same[-1] + 1)
    return order


def _tier(option: str, value: Any) -> Optional[int]:
    """How far the lever that is `option`=`value` reduces the arithmetic (TuneHints.tier); 0 for a value that is no
    lever (fp32), None for an option whose levers declare no tiers."""
    tiers = {lever.value: lever.tune.tier for lever in all_levers()
             if lever.option == option and lever.tune.tier is not None}
    return tiers.get(value, 0) if tiers else None


def replaces_kept(option: str, value: Any, best: RunConfig, start: RunConfig) -> Optional[str]:
    """Why a one-value lever would replace a kept lever rather than add to it (its option already holds another
    value that tune kept), or a precision no lower than the current one (tf32 after bf16); None when it adds."""
    current, started = getattr(best, option), getattr(start, option)
    if current == value or current is None:
        return None
    flag = "--" + option.replace("_", "-")
    tier, current_tier = _tier(option, value), _tier(option, current)
    if tier is not None and tier <= current_tier:  # a candidate precision is tried only above the current one
        origin = "the starting point" if current == started else "kept"
        return (f"{flag} is already {current} ({origin}); {value} reduces the arithmetic no further, and would "
                "replace it, not add to it")
    if current == started:
        return None
    return (f"{flag} is already {current} (kept); {value} would replace it, not add to it, and would be "
            f"measured against it")

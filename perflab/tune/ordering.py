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

A lever that would replace one already kept instead of adding to it (tf32 after bf16 was kept: both are values of
--precision) is not a candidate at all: `replaces_kept` says why.
"""
from __future__ import annotations

from typing import Any, Optional

from perflab.config import RunConfig

REDUCED_PRECISION = ("bf16", "fp16")
LAYOUT = "channels-last"
DEVICE_AUGMENT = "augment-gpu"
LOADER_QUEUE = ("prefetch-factor", "persistent-workers", "prefetcher-stream", "pin-memory")
COMPILE_COST = ("compile",)  # levers whose trial compiles the model
# A kept lever whose partner is tried at once, before the re-profile (the partner is what the kept lever needs)
PARTNERS = {precision: LAYOUT for precision in REDUCED_PRECISION}


def arrange(proposals: list[Any], best: RunConfig) -> list[Any]:
    """The proposals in the order tune tries them (see the module docstring for the rules)."""
    order = list(proposals)
    order = _layout_after_precision(order, best)
    order = _device_augment_before_queue(order)
    return _compile_after_cheap_levers(order)


def _names(order: list[Any]) -> list[str]:
    return [proposal.lever for proposal in order]


def _move(order: list[Any], lever: str, index: int) -> list[Any]:
    """`order` with `lever` moved to position `index` (of the list without it)."""
    moving = next(proposal for proposal in order if proposal.lever == lever)
    rest = [proposal for proposal in order if proposal.lever != lever]
    return rest[:index] + [moving] + rest[index:]


def _layout_after_precision(order: list[Any], best: RunConfig) -> list[Any]:
    names = _names(order)
    if LAYOUT not in names:
        return order
    if best.precision in REDUCED_PRECISION:  # first among the levers of the finding that proposed it
        source = order[names.index(LAYOUT)].source
        return _move(order, LAYOUT, next(index for index, proposal in enumerate(order) if proposal.source == source))
    precise = [name for name in names if name in REDUCED_PRECISION]
    if not precise:
        return order
    rest = [name for name in names if name != LAYOUT]
    return _move(order, LAYOUT, rest.index(precise[0]) + 1)


def _device_augment_before_queue(order: list[Any]) -> list[Any]:
    """augment-gpu moves before the first loader-queue lever (workers, searched first, stays ahead of it)."""
    names = _names(order)
    if DEVICE_AUGMENT not in names:
        return order
    queue = [names.index(name) for name in LOADER_QUEUE if name in names]
    if not queue or min(queue) > names.index(DEVICE_AUGMENT):
        return order
    return _move(order, DEVICE_AUGMENT, min(queue))


def _compile_after_cheap_levers(order: list[Any]) -> list[Any]:
    """Each compile lever moves behind the last cheap lever the same finding named (not behind the levers that
    merely address its class: those are the next most likely, not the finding's advice)."""
    for lever in COMPILE_COST:
        names = _names(order)
        if lever not in names:
            continue
        source = order[names.index(lever)].source
        rest = [proposal for proposal in order if proposal.lever != lever]
        same = [index for index, proposal in enumerate(rest) if proposal.source == source and proposal.named]
        if same and same[-1] >= names.index(lever):
            order = _move(order, lever, same[-1] + 1)
    return order


# How far each --precision reduces the arithmetic: a candidate precision is tried only above the current one
PRECISION_TIER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 2}


def replaces_kept(option: str, value: Any, best: RunConfig, start: RunConfig) -> Optional[str]:
    """Why a one-value lever would replace a kept lever rather than add to it (its option already holds another
    value that tune kept), or a precision no lower than the current one (tf32 after bf16); None when it adds."""
    current, started = getattr(best, option), getattr(start, option)
    if current == value or current is None:
        return None
    flag = "--" + option.replace("_", "-")
    if option == "precision" and PRECISION_TIER.get(value, 0) <= PRECISION_TIER.get(current, 0):
        origin = "the starting point" if current == started else "kept"
        return (f"{flag} is already {current} ({origin}); {value} reduces the arithmetic no further, and would "
                "replace it, not add to it")
    if current == started:
        return None
    return (f"{flag} is already {current} (kept); {value} would replace it, not add to it, and would be "
            f"measured against it")

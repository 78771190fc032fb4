"""Workload settings (`--option KEY=VALUE`): each workload declares its keys once, with types and ranges.

A workload module (built-in or a user's plugin) lists `OPTIONS = (setting(...), ...)`. perflab then refuses
unknown keys and ill-typed or out-of-range values with the valid keys listed, `perflab workloads` shows them,
and `build(cfg)` reads the typed values with defaults filled in through `resolve_settings`. A plugin that
declares no OPTIONS gets its `--option` values as given (strings).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from perflab import options
from perflab.errors import PerflabError


@dataclass(frozen=True)
class ByDevice:
    """A default that depends on the run's device (full size on a GPU, small on a CPU)."""

    cuda: Any
    cpu: Any

    def __str__(self) -> str:
        return f"{self.cuda} on CUDA, {self.cpu} on CPU"


def setting(key: str, type: Callable[[str], Any], help: str, default: Any = None, minimum: Optional[float] = None,
            choices: tuple = ()) -> options.Option:
    """One `--option KEY=VALUE` a workload understands (`default` may be ByDevice(cuda=..., cpu=...))."""
    return options.Option(flag=f"--option {key}", type=type, help=help, group="workload", default=default,
                          minimum=minimum, choices=choices, name=key)


def describe(declared: options.Option) -> str:
    """'image_res (int >= 8, default 224 on CUDA, 64 on CPU): camera image side'."""
    kind = declared.type.__name__
    if declared.choices:
        kind = "|".join(map(str, declared.choices))
    if declared.minimum is not None:
        kind += f" >= {declared.minimum:g}"
    default = "" if declared.default is None else f", default {declared.default}"
    return f"{declared.name} ({kind}{default}): {declared.help}"


def check_settings(workload: str, declared: Sequence[options.Option], given: dict[str, Any]) -> dict[str, Any]:
    """The given settings, typed and checked; unknown keys, bad types and out-of-range values are refused."""
    by_key = {option.name: option for option in declared}
    typed: dict[str, Any] = {}
    for key, value in given.items():
        if key not in by_key:
            raise PerflabError(f"{workload} has no option {key!r}; its options: {_listing(declared)}")
        option = by_key[key]
        if isinstance(value, str) and option.type is not str:
            try:
                value = option.type(value)
            except ValueError:
                raise PerflabError(f"{workload}: {option.flag} must be {_kind(option)}, got {value!r}; "
                                   f"{describe(option)}") from None
        try:
            options.check_value(option, value)
        except PerflabError as err:
            raise PerflabError(f"{workload}: {err}; {describe(option)}") from None
        typed[key] = value
    return typed


def resolve_settings(declared: Sequence[options.Option], given: dict[str, Any], device: str) -> dict[str, Any]:
    """Every declared setting: the given (checked) value, or its default for `device`."""
    values = {}
    for option in declared:
        default = option.default
        if isinstance(default, ByDevice):
            default = default.cuda if device == "cuda" else default.cpu
        value = given.get(option.name, default)
        if isinstance(value, str) and option.type is not str:
            value = option.type(value)
        values[option.name] = value
    return values


def _kind(option: options.Option) -> str:
    return {int: "an integer", float: "a number"}.get(option.type, option.type.__name__)


def _listing(declared: Sequence[options.Option]) -> str:
    return "; ".join(describe(option) for option in declared) or "none (this workload takes no --option)"

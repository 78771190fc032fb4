"""One declaration per option: a dataclass field carries its flag, type, choices, default, help and needs.

A config dataclass (RunConfig, and the configs of the drivers) declares each field with `option(...)`.
Everything else is derived from those declarations: validation with messages a user can act on, the
argparse arguments of every command that takes the option (comma lists for sweeps), the argv that
reproduces a config (rerun, the nsys command, child processes), and the refusals of the levers that the
option switches on (needs CUDA, applies to one mode, conflicts with another option).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from perflab.environment import usable_cpus
from perflab.errors import PerflabError

RUN_COMMANDS = ("run", "profile", "sweep", "tune")  # tune takes run options as its starting point
LIST_COMMANDS = ("sweep",)  # commands whose sweepable options take comma-separated lists
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off"}
MAX_SEED = 2**32 - 1  # numpy's generators (data order, augmentation, arrivals) take seeds up to this
NONE_WORD = "none"  # in a sweep list, "none" means the option's unset value (e.g. --compile none,default)


@dataclass(frozen=True)
class Conflict:
    """This option (when its value is `when`: one value or a tuple of values; or whenever it is set) cannot be combined
    with `other` set to `value` (one value, a tuple of values, or None: set to anything)."""

    other: str
    reason: str
    value: Any = None
    when: Any = None

    def applies(self, config: Any, own_value: Any) -> bool:
        if self.when is not None and own_value not in (self.when if isinstance(self.when, tuple) else (self.when,)):
            return False
        other_value = getattr(config, self.other)
        if self.value is None:
            return is_set(option_named(type(config), self.other), other_value)
        if isinstance(self.value, tuple):
            return other_value in self.value
        return other_value == self.value


@dataclass(frozen=True)
class Bound:
    """This option's value must stay below (`strict`) or at most the value of option `other` of the same config: a
    bound one number cannot state (--node-rank below --nnodes). Checked, as a Conflict is, whenever it is set."""

    other: str
    reason: str
    strict: bool = False

    def applies(self, config: Any, own_value: Any) -> bool:
        limit = getattr(config, self.other)
        if own_value is None or limit is None:
            return False
        return own_value >= limit if self.strict else own_value > limit


@dataclass(frozen=True)
class Requires:
    """This option, whenever it is set, needs option `other` set too (--quantize-kernel without --quantize picks a
    kernel for nothing). Checked, as a Conflict is, whenever it is set."""

    other: str
    reason: str

    def applies(self, config: Any, own_value: Any) -> bool:
        return not is_set(option_named(type(config), self.other), getattr(config, self.other))


@dataclass(frozen=True)
class Option:
    """Everything perflab knows about one option; `name` is the config field it fills."""

    flag: str
    type: Callable[[str], Any]  # converts the command-line text; bool for on/off switches
    help: str
    group: str
    default: Any = None
    choices: tuple = ()
    metavar: Optional[str] = None
    negatable: bool = False  # a switch with a --no-... form
    const: Any = None  # the value when the flag is given without one (e.g. --compile alone -> "default")
    minimum: Optional[float] = None  # inclusive lower bound
    above: Optional[float] = None  # exclusive lower bound
    maximum: Optional[float] = None  # inclusive upper bound
    finite: bool = True  # a number option refuses nan and inf
    per_cpu: Optional[int] = None  # at most this many per CPU this process may use (more only contend)
    sweepable: bool = True  # a sweep may take a comma-separated list of values
    commands: tuple = RUN_COMMANDS  # which commands accept it
    in_argv: bool = True  # reproduced when a config is turned back into a command line
    changes_numerics: Union[bool, tuple] = False  # True, or the values that may change the outputs
    needs_cuda: Union[bool, tuple] = False  # True (whenever set), or the values that need a CUDA GPU
    modes: tuple = ()  # the --mode values it applies to; empty: every mode
    conflicts: tuple = ()  # Conflict, Bound and Requires rules, checked whenever this option is set
    key_value: bool = False  # repeatable KEY=VALUE pairs collected into a dict
    repeatable: bool = False  # the flag may be given several times; the values are collected into a list
    # a workload's build(cfg) reads it (--augment picks the dataset and sets gpu_augment): what the build made for
    # one value says nothing of another, so a refusal read off a workload built without it is checked again
    read_by_build: bool = False
    deprecated: tuple = ()  # old spellings still accepted, each with a one-line note on stderr
    dest: str = ""  # the argparse destination when the field's name is taken by another table's option
    name: str = ""

    @property
    def arg_name(self) -> str:
        """Where argparse puts the value (the field's name unless `dest` says otherwise)."""
        return self.dest or self.name

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every way to write the flag on a command line: the flag, its --no- form, the deprecated spellings."""
        negated = ("--no-" + self.flag[2:],) if self.switch and self.negatable else ()
        return (self.flag, *negated, *self.deprecated)

    @property
    def switch(self) -> bool:
        return self.type is bool

    def value_needs_cuda(self, value: Any) -> bool:
        return _matches(self.needs_cuda, self, value)

    def value_changes_numerics(self, value: Any) -> bool:
        return _matches(self.changes_numerics, self, value)

    def flag_for(self, value: Any = None) -> str:
        """How a user writes this option with `value` (or generically, when value is None)."""
        if self.switch:
            return self.flag if value is not False else "--no-" + self.flag[2:]
        if value is None or value is True:
            if self.const is not None:
                return f"{self.flag} [{'|'.join(self.choices)}]"
            return f"{self.flag} {self.metavar or 'N'}"
        return f"{self.flag} {value}"


def _matches(rule: Union[bool, tuple], option: Option, value: Any) -> bool:
    if isinstance(rule, tuple):
        return value in rule
    return bool(rule) and is_set(option, value)


def is_set(option: Option, value: Any) -> bool:
    """True when a value turns the option on: not unset, not off, not the default."""
    return value is not None and value is not False and value != option.default


def option(flag: str, type: Callable[[str], Any], help: str, group: str, default: Any = None,
           **settings: Any) -> Any:
    """A dataclass field declared as a command-line option (see Option for the settings)."""
    declared = Option(flag=flag, type=type, help=help, group=group, default=default, **settings)
    if isinstance(default, (dict, list)):  # a mutable default: each config gets its own empty one
        empty = dict if isinstance(default, dict) else list
        return dataclasses.field(default_factory=empty, metadata={"option": declared})
    return dataclasses.field(default=default, metadata={"option": declared})


@functools.lru_cache(maxsize=None)
def options_of(config_class: type) -> tuple[Option, ...]:
    """The options a config dataclass declares, in field order, with their names filled in."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name) for f in dataclasses.fields(config_class)
                 if "option" in f.metadata)


def option_named(config_class: type, name: str) -> Option:
    for declared in options_of(config_class):
        if declared.name == name:
            return declared
    raise KeyError(f"{config_class.__name__} declares no option {name!r}")


# ---------------------------------------------------------------------------------------------- validation

MODE_WORDS = {"train": "training", "infer": "inference"}


def validate(config: Any) -> None:
    """Raise PerflabError naming the first bad option: its type, choices and range, then the modes it
    applies to and the options it conflicts with (what needs a device is checked when one is chosen)."""
    for declared in options_of(type(config)):
        check_value(declared, getattr(config, declared.name))
    for declared in options_of(type(config)):
        value = getattr(config, declared.name)
        if is_set(declared, value):
            reason = _config_refusal(config, declared, value)
            if reason:
                raise PerflabError(f"{declared.flag_for(value)} refused: {reason}")


def check_value(declared: Option, value: Any) -> None:
    if value is None and (declared.default is None or declared.switch):
        return
    if declared.key_value:
        if not isinstance(value, dict):
            raise PerflabError(f"{declared.flag} must be KEY=VALUE pairs (a dict), got {value!r}")
        return
    if declared.repeatable:
        if not isinstance(value, (list, tuple)):
            raise PerflabError(f"{declared.flag} must be a list of values, got {value!r}")
        for item in value:
            check_value(dataclasses.replace(declared, repeatable=False), item)
        return
    expected = {bool: bool, int: int, float: (int, float), str: str}.get(declared.type, object)
    if not isinstance(value, expected) or (declared.type is int and isinstance(value, bool)):
        kind = {bool: "on/off (True or False)", int: "an integer", float: "a number", str: "text"}
        raise PerflabError(f"{declared.flag} must be {kind.get(declared.type, declared.type.__name__)}, "
                           f"got {value!r}")
    if declared.type is str and isinstance(value, str) and not value.strip():
        raise PerflabError(f"{declared.flag} is empty; give a value, or drop {declared.flag} to keep its default")
    if declared.choices and value not in declared.choices:
        raise PerflabError(f"{declared.flag} must be one of {', '.join(declared.choices)}; got {value!r}")
    if declared.type is float and declared.finite and not math.isfinite(value):  # inf passes every bound, NaN none
        words = range_words(declared)
        positive = "a positive number"
        what = "a positive finite number" + words[len(positive):] if words.startswith(positive) else (
            f"a finite number{f', {words}' if words else ''}")
        raise PerflabError(f"{declared.flag} must be {what}, got {value!r}")
    too_low = (declared.minimum is not None and value < declared.minimum) or (
        declared.above is not None and not value > declared.above)
    if too_low or (declared.maximum is not None and value > declared.maximum):
        raise PerflabError(f"{declared.flag} must be {range_words(declared)}, got {value!r}")
    if declared.per_cpu is not None:
        check_against_cpus(declared, value)


def check_against_cpus(declared: Option, count: int) -> None:
    """Refuse a count far beyond the CPUs this process may use (`per_cpu` of them per CPU at most)."""
    cpus = usable_cpus()
    most = declared.per_cpu * cpus
    if count > most:
        raise PerflabError(f"{declared.flag} {count} is more than {declared.per_cpu}x the {cpus} usable CPU(s) of "
                           f"this machine; use {declared.flag} {most} or fewer")


def range_words(declared: Option) -> str:
    """'a positive integer', '0 or more', 'from 0 to 4294967295': the range a number option accepts ('' if any)."""
    low, high = declared.minimum, declared.maximum
    if low is not None and high is not None:
        return f"from {_number(low)} to {_number(high)}"
    if declared.above is not None:
        words = "a positive number" if declared.above == 0 else f"more than {_number(declared.above)}"
        return words + (f" up to {_number(high)}" if high is not None else "")
    if low is not None:
        return "a positive integer" if declared.type is int and low == 1 else f"{_number(low)} or more"
    return f"{_number(high)} or less" if high is not None else ""


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def refusal(config: Any, name: str, device_type: str) -> Optional[str]:
    """Why the option `name`, as set in `config`, cannot run here (needs CUDA, wrong mode, a conflict)."""
    declared = option_named(type(config), name)
    value = getattr(config, name)
    if device_type != "cuda" and declared.value_needs_cuda(value):
        return (f"{declared.flag_for(value)} needs a CUDA GPU and this run is on {device_type}; drop the flag "
                "or use --device cuda")
    return _config_refusal(config, declared, value)


def _config_refusal(config: Any, declared: Option, value: Any) -> Optional[str]:
    mode = getattr(config, "mode", None)
    if declared.modes and mode not in declared.modes:
        words = " or ".join(MODE_WORDS.get(m, m) for m in declared.modes)
        return f"{declared.flag} only applies to --mode {' or '.join(declared.modes)} ({words} runs)"
    for conflict in declared.conflicts:
        if conflict.applies(config, value):
            return conflict.reason
    return None


# ---------------------------------------------------------------------------------------------- argparse

def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise PerflabError(f"expected on/off (or true/false), got {text!r}")


def add_arguments(parser: argparse.ArgumentParser, config_class: type, command: str) -> None:
    """Add every option of `config_class` that `command` takes; in a LIST_COMMANDS command, sweepable options
    take comma-separated lists (parsed by `grid_from_args`)."""
    lists = command in LIST_COMMANDS
    groups: dict[str, Any] = {}
    for declared in options_of(config_class):
        if command not in declared.commands:
            continue
        if declared.group not in groups:
            groups[declared.group] = parser.add_argument_group(declared.group)
        _add_argument(groups[declared.group], declared, lists and declared.sweepable)


def _add_argument(group: Any, declared: Option, as_list: bool, checked: bool = False) -> None:
    """One option's argparse argument; `checked`: its range is checked as the command line is read (an option
    outside a config table, which no validate() sees)."""
    common = dict(dest=declared.arg_name, default=None, help=declared.help)
    for old in declared.deprecated:  # a switch's old spelling takes no value, like the switch
        deprecated_flag(group, old, declared.flag, dest=declared.arg_name, default=None,
                        nargs=0 if declared.switch and not as_list else None,
                        type=None if declared.switch or as_list else _converter(declared, checked))
    if declared.key_value:
        group.add_argument(declared.flag, action="append", metavar=declared.metavar or "KEY=VALUE", **common)
    elif declared.repeatable:
        group.add_argument(declared.flag, action="append", type=_converter(declared, checked),
                           metavar=declared.metavar, **common)
    elif as_list and declared.switch:
        group.add_argument(declared.flag, nargs="?", const="on", metavar="on,off",
                           **{**common, "help": declared.help + " (a list like on,off sweeps both)"})
    elif as_list:
        metavar = declared.metavar or ("A,B" if declared.choices else "N,M")
        group.add_argument(declared.flag, type=str, metavar=metavar, **common)
    elif declared.switch and declared.negatable:
        group.add_argument(declared.flag, action=argparse.BooleanOptionalAction, **common)
    elif declared.switch:
        group.add_argument(declared.flag, action="store_true", **common)
    elif declared.const is not None:
        group.add_argument(declared.flag, nargs="?", const=declared.const, choices=declared.choices or None,
                           metavar=declared.metavar, **common)
    else:
        group.add_argument(declared.flag, type=_converter(declared, checked), choices=declared.choices or None,
                           metavar=declared.metavar, **common)


def add_option(parser: Any, declared: Option) -> None:
    """Add one command-line option declared on its own (a command's setting outside any config table): argparse
    reads it with the declaration's type, range and default, as for a table's options."""
    declared = dataclasses.replace(declared, name=declared.name or declared.flag[2:].replace("-", "_"))
    _add_argument(parser, declared, as_list=False, checked=True)
    parser.set_defaults(**{declared.arg_name: declared.default})


class DeprecatedSpelling(argparse.Action):
    """An option's old spelling: stores its value as the new one does, with a one-line note on stderr."""

    def __init__(self, option_strings: list[str], dest: str, new_flag: str, **settings: Any):
        super().__init__(option_strings, dest, **settings)
        self.new_flag = new_flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        sys.stderr.write(f"perflab: {option_string} is deprecated; use {self.new_flag} (same meaning)\n")
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecated_flag(parser: Any, old: str, new: str, **settings: Any) -> None:
    """Accept `old` as a hidden, deprecated spelling of the argparse option `new` (same dest and type)."""
    parser.add_argument(old, action=DeprecatedSpelling, new_flag=new, help=argparse.SUPPRESS, **settings)


def _converter(declared: Option, checked: bool = False) -> Callable[[str], Any]:
    """The argparse type of an option: its type, and with `checked` its declared range too."""
    def convert(text: str) -> Any:
        try:
            value = declared.type(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(declared.type, declared.type.__name__)
            raise argparse.ArgumentTypeError(f"{declared.flag} expects {kind}, got {text!r}") from None
        if checked:
            try:
                check_value(declared, value)
            except PerflabError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
        return value
    convert.__name__ = declared.type.__name__
    return convert


def key_values(pairs: Optional[Sequence[str]], flag: str = "--option") -> dict[str, str]:
    """['k=v', ...] -> {'k': 'v'}."""
    found: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise PerflabError(f"{flag} expects KEY=VALUE, got {pair!r}")
        if key in found:
            raise PerflabError(f"{flag} {key}= is given twice ({key}={found[key]} and {pair}); give each key once")
        found[key] = text
    return found


def changes_from_args(config_class: type, args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The options given to `command` on the command line (single values), as config field changes."""
    changes: dict[str, Any] = {}
    for declared in options_of(config_class):
        value = getattr(args, declared.arg_name, None)
        if value is None or command not in declared.commands:
            continue
        changes[declared.name] = key_values(value, declared.flag) if declared.key_value else value
    return changes


def flags_of(config_class: type, command: str) -> set[str]:
    """Every spelling of the options of `config_class` that `command` takes."""
    return {spelling for declared in options_of(config_class) if command in declared.commands
            for spelling in declared.spellings}


def grid_from_args(config_class: type, args: argparse.Namespace, command: str = "sweep"
                   ) -> tuple[list[Any], list[str]]:
    """Expand comma-separated options into the grid of configs, and name the fields that vary."""
    axes: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for declared in options_of(config_class):
        value = getattr(args, declared.arg_name, None)
        if value is None or command not in declared.commands:
            continue
        if declared.key_value:
            fixed[declared.name] = key_values(value, declared.flag)
        elif declared.sweepable:
            axes[declared.name] = _list_values(declared, str(value))
        else:
            fixed[declared.name] = value
    swept = [name for name, values in axes.items() if len(values) > 1]
    configs = [config_class(**fixed, **dict(zip(axes, combo))) for combo in itertools.product(*axes.values())]
    for config in configs:
        config.validate()
    return configs, swept


def _list_values(declared: Option, text: str) -> list[Any]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise PerflabError(f"{declared.flag}: give at least one value")
    values = []
    for part in parts:
        if part.lower() == NONE_WORD and declared.default is None:
            values.append(None)
        elif declared.switch:
            values.append(parse_bool(part))
        else:
            try:
                values.append(declared.type(part))
            except ValueError:
                raise PerflabError(f"{declared.flag}: cannot read {text!r} as a list of values") from None
    return values


# ---------------------------------------------------------------------------------------------- argv

def to_argv(config: Any, command: str = "run") -> list[str]:
    """Command-line options that rebuild `config` (options left at their defaults are omitted)."""
    argv: list[str] = []
    for declared in options_of(type(config)):
        if not declared.in_argv or command not in declared.commands:
            continue
        value = getattr(config, declared.name)
        if declared.key_value:
            for key, text in (value or {}).items():
                argv += [declared.flag, f"{key}={text}"]
        elif declared.repeatable:
            for item in value or []:
                argv += [declared.flag, str(item)]
        elif value is None or value == declared.default:
            continue
        elif declared.switch and command in LIST_COMMANDS and declared.sweepable:
            argv += [declared.flag, "on" if value else "off"]
        elif declared.switch:
            argv.append(declared.flag if value else "--no-" + declared.flag[2:])
        else:
            argv += [declared.flag, str(value)]
    return argv

"""Typed records read back from the JSON perflab writes (diagnosis.json, tune.jsonl, tune.json, memory.json,
result.json's sections): dataclasses built from saved dicts by their type hints, tolerating what older and newer files
hold. One reader for all of them (load_value):

- a key the class does not declare is dropped (`unknown_keys` gives them to a record that keeps them);
- a declared field the file lacks, or saved as null where its type admits no None, takes its default, or an empty
  value of its type when it has none;
- a nested record is built by its class's own from_dict (results/metrics.py Section keeps unknown keys) or by build;
  lists and dicts of records too; an optional record saved as {} or null is None;
- a string, list, dict or flag saved as null, or as the wrong kind, reads as an empty string, list, dict or False.
"""
from __future__ import annotations

import dataclasses
import typing
from functools import lru_cache
from typing import Any, TypeVar, Union

R = TypeVar("R", bound="Record")
EMPTY_KINDS = (list, dict, int, float, str, bool)


class Record:
    """A dataclass that saves as a dict and loads from one (build)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        return build(cls, data)


def build(cls: type, data: dict[str, Any]) -> Any:
    """An instance of the dataclass `cls` from a saved dict, nested records (lists and dicts of them too) included."""
    hints = field_types(cls)
    values = {}
    for item in dataclasses.fields(cls):
        hint, value = hints[item.name], data.get(item.name)
        if item.name in data and (value is not None or _admits_none(hint)):
            values[item.name] = load_value(hint, value)
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            values[item.name] = _empty(hint)  # (a field that cannot be None, saved as null, takes its default)
    return cls(**values)


def _admits_none(hint: Any) -> bool:
    """Whether a field of this type may hold None (Optional[...], Any)."""
    return hint is Any or (typing.get_origin(hint) is Union and type(None) in typing.get_args(hint))


def unknown_keys(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of `data` that name no field of the dataclass `cls` (a record that writes them back keeps them)."""
    names = {item.name for item in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key not in names}


@lru_cache(maxsize=None)  # one resolution per record class
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass's fields."""
    return typing.get_type_hints(cls)


def load_value(hint: Any, value: Any) -> Any:
    """`value` as read from a file, made what the type hint `hint` declares (see the module docstring)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        inner = [arg for arg in args if arg is not type(None)]
        if value is None or len(inner) != 1:
            return value
        if dataclasses.is_dataclass(inner[0]) and (value == {} or not isinstance(value, dict)):
            return None  # an absent record was saved as {} (or as something that is no record)
        return load_value(inner[0], value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return _empty(hint)
        reader = getattr(hint, "from_dict", None)
        return reader(value) if reader is not None else build(hint, value)  # a record's own reader first
    kind = origin or hint
    if kind is list:
        return [load_value(args[0], item) for item in value] if args and isinstance(value, list) else (
            list(value) if isinstance(value, list) else [])
    if kind is dict:
        if not isinstance(value, dict):
            return {}
        return {key: load_value(args[1], item) for key, item in value.items()} if len(args) == 2 else dict(value)
    if hint is str:
        return "" if value is None else str(value)
    if hint is bool:
        return bool(value)
    return value


def _empty(hint: Any) -> Any:
    """The value of a required field that an older file did not save."""
    origin = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(hint):
        return build(hint, {})
    if origin in EMPTY_KINDS:
        return origin()
    return None

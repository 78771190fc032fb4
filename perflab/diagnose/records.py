"""Typed records of a diagnosis (findings, the trace profile, the operator view): dataclasses read as attributes,
turned into plain dicts only to be saved (diagnosis.json) and built back from them when loaded."""
from __future__ import annotations

import dataclasses
import typing
from functools import lru_cache
from typing import Any, TypeVar, Union

R = TypeVar("R", bound="Record")


class Record:
    """A dataclass that saves as a dict and loads from one, tolerating the keys of older diagnosis.json files: keys
    it does not know are dropped, fields missing from the dict take their default (or an empty value)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        return build(cls, data)


def build(cls: type, data: dict[str, Any]) -> Any:
    """An instance of the dataclass `cls` from a saved dict, nested records (lists and dicts of them too) included."""
    hints = _hints(cls)
    values = {}
    for item in dataclasses.fields(cls):
        if item.name in data:
            values[item.name] = _load(hints[item.name], data[item.name])
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            values[item.name] = _empty(hints[item.name])
    return cls(**values)


@lru_cache(maxsize=None)  # one resolution per record class
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _load(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) != 1:
            return value
        if dataclasses.is_dataclass(inner[0]) and value == {}:
            return None  # an absent record was saved as {}
        return _load(inner[0], value)
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return hint.from_dict(value) if issubclass(hint, Record) else build(hint, value)  # a record's own from_dict
    if origin is list and args and isinstance(value, list):
        return [_load(args[0], item) for item in value]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: _load(args[1], item) for key, item in value.items()}
    return value


def _empty(hint: Any) -> Any:
    """The value of a required field that an older file did not save."""
    origin = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(hint):
        return build(hint, {})
    if origin in (list, dict, int, float, str, bool):
        return origin()
    return None

"""Reading back what tune wrote (tune.jsonl, tune.json): a dataclass from a recorded dict, tolerating the keys an
older file lacks."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Mapping, Optional, TypeVar

T = TypeVar("T")
Reader = Callable[[Any], Any]


def field_names(cls: type) -> set[str]:
    return {declared.name for declared in fields(cls)}


def from_fields(cls: Callable[..., T], data: Mapping[str, Any], readers: Optional[Mapping[str, Reader]] = None,
                **missing: Any) -> T:
    """An instance of the dataclass `cls` from the entries of `data` that name its fields, each read by its reader in
    `readers` where it has one (given the recorded value as is); an entry the file lacks takes its value in `missing`
    (a required field's), else the field's default; unknown entries are left out."""
    readers = readers or {}
    names = field_names(cls)  # type: ignore[arg-type]
    known = {key: readers[key](value) if key in readers else value for key, value in data.items() if key in names}
    return cls(**{**missing, **known})


def text(value: Any) -> str:
    """A recorded string ('' where it is missing or null)."""
    return "" if value is None else str(value)


def record_or_none(reader: Callable[[dict[str, Any]], T]) -> Callable[[Any], Optional[T]]:
    """A reader of one nested record: None where it is missing or not an object."""
    return lambda value: reader(value) if isinstance(value, dict) else None


def records(reader: Callable[[dict[str, Any]], T]) -> Callable[[Any], list[T]]:
    """A reader of a list of nested records: the objects in it, each read; nothing where it is not a list."""
    return lambda value: [reader(item) for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def section(value: Any) -> dict[str, Any]:
    """A recorded object (an empty one where it is not one)."""
    return dict(value) if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    """A recorded list (an empty one where it is not one)."""
    return list(value) if isinstance(value, list) else []

"""Checks for files perflab reads back (result.json, compare.json, sweep.jsonl, tune.jsonl, tune.json): a hand-edited
figure of the wrong kind is refused in one line naming the file, the field and what was expected (PerflabError,
exit 2), before any statistic or report trips over it with a TypeError deep inside."""
from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from perflab.errors import PerflabError

REMEDY = "fix that field or re-run to regenerate the file"


def parse_json(text: str, file: object, where: str = "") -> Any:
    """json.loads, refusing a document nested too deeply for Python to parse in one line (no RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise PerflabError(f"{file}{where} is too deeply nested to be a perflab file (JSON nested past Python's "
                           f"recursion limit); {REMEDY}") from None


def kind_of(value: Any) -> str:
    """How a value of the wrong kind reads in a message: "the string 'x'", "the number 5", "a list"..."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if is_number(value):
        return f"the number {value!r}"
    return {list: "a list", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(data: dict, field: str, file: object, optional: bool = True, whole: bool = False,
           prefix: str = "") -> Optional[float]:
    """data[field], refused unless it is a JSON number (an integer when `whole`), or null/absent when `optional`;
    `prefix` says where `data` sits in the file (e.g. "trials[2].")."""
    value = data.get(field) if isinstance(data, dict) else None
    if value is None and optional:
        return None
    if not is_number(value) or (whole and not isinstance(value, int)):
        expected = "an integer" if whole else "a number"
        raise PerflabError(f"{file}: field {prefix}{field} must be {expected}{' or null' if optional else ''}, "
                           f"found {kind_of(value)}; {REMEDY}")
    return value


def numbers(data: dict, fields: Iterable[str], file: object, prefix: str = "") -> None:
    """Every one of `fields` present in `data` is a number or null."""
    for name in fields:
        number(data, name, file, prefix=prefix)


def number_list(data: dict, field: str, file: object, optional: bool = True, prefix: str = "") -> None:
    """data[field] is a list of numbers (or nulls); the first offending entry is named."""
    value = data.get(field) if isinstance(data, dict) else None
    if value is None and optional:
        return
    if not isinstance(value, list):
        raise PerflabError(f"{file}: field {prefix}{field} must be a list of numbers, found {kind_of(value)}; {REMEDY}")
    for index, item in enumerate(value):
        if item is not None and not is_number(item):
            raise PerflabError(f"{file}: field {prefix}{field}[{index}] must be a number, found {kind_of(item)}; "
                               f"{REMEDY}")


def section(data: dict, field: str, file: object) -> dict:
    """data[field] as an object ({} when absent or null), refused when it is anything else."""
    value = data.get(field) if isinstance(data, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PerflabError(f"{file}: field {field} must be an object, found {kind_of(value)}; {REMEDY}")
    return value


def objects(data: dict, field: str, file: object) -> list[dict]:
    """data[field] as a list of objects ([] when absent or null)."""
    value = data.get(field) if isinstance(data, dict) else None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise PerflabError(f"{file}: field {field} must be a list of objects, found {kind_of(value)}; {REMEDY}")
    return value

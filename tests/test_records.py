"""The one reader of saved records (perflab/results/records.py): what older and newer files hold, read as typed."""
from dataclasses import dataclass, field
from typing import Any, Optional

from perflab.results.records import Record, build, unknown_keys


@dataclass
class Inner(Record):
    name: str
    share: Optional[float] = None


@dataclass
class Outer(Record):
    kept: bool
    label: str
    judged: bool = True
    inner: Optional[Inner] = None
    inners: list[Inner] = field(default_factory=list)
    by_name: dict[str, Inner] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reason: Optional[str] = ""
    value: Any = None


def test_a_saved_record_reads_back_typed_and_writes_back_the_same():
    record = Outer(kept=True, label="bf16", inner=Inner("a", 0.5), inners=[Inner("b")], by_name={"c": Inner("c", 1.0)},
                   notes=["n"], reason=None, value=[1, 2])
    assert Outer.from_dict(record.to_dict()) == record


def test_an_older_file_missing_entries_gets_defaults_and_empty_values_and_newer_keys_are_dropped():
    read = Outer.from_dict({"kept": 1, "added_later": 3})
    assert read == Outer(kept=True, label="")
    assert unknown_keys(Outer, {"kept": 1, "added_later": 3}) == {"added_later": 3}


def test_null_where_the_type_admits_none_stays_none_and_elsewhere_takes_the_default():
    read = build(Outer, {"kept": None, "label": None, "judged": None, "inner": None, "notes": None, "reason": None,
                         "value": None})
    assert read.kept is False and read.label == "" and read.judged is True  # judged's default, not bool(None)
    assert read.inner is None and read.notes == [] and read.reason is None and read.value is None


def test_the_wrong_kind_of_value_reads_as_an_empty_one_and_an_empty_record_as_none():
    read = build(Outer, {"kept": True, "label": 7, "inner": {}, "inners": "not a list", "by_name": [1],
                         "notes": {"a": 1}})
    assert read.label == "7" and read.inner is None and read.inners == [] and read.by_name == {} and read.notes == []
    assert build(Outer, {"kept": True, "label": "x", "inner": "gone"}).inner is None

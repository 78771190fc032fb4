"""Diagnose: parse a trace once, run one small rule per bottleneck class, and name the verdict.

    diagnosis = perflab.diagnose.diagnose_path("runs/<id>/")   # or a trace.json / trace.json.gz
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

from perflab.bottlenecks import CLASS_SLUGS
from perflab.diagnose.findings import Context, Finding
from perflab.diagnose.op_graph import OpGraph
from perflab.diagnose.operators import operator_view
from perflab.diagnose.summary import summarize
from perflab.diagnose.trace import ParsedTrace, load_trace
from perflab.diagnose.verdict import Diagnosis, decide, run_rules
from perflab.errors import PerflabError
from perflab.levers import all_levers
from perflab.results import Result
from perflab.results.kind import is_serve_result

DIAGNOSIS_FILE = "diagnosis.json"
TRACE_NAMES = ("trace.json", "trace.json.gz")


def diagnose(trace: Union[str, Path, ParsedTrace], result=None, tried_and_lost: Iterable[str] = ()) -> Diagnosis:
    """The diagnosis of one trace, using the run's Result (phase shares, memory, NVML) when given.

    `tried_and_lost` names levers (`perflab levers`) already measured on this run that did not win: they are not
    proposed again, and the findings they addressed say what is left to do instead.
    """
    lost = _lever_names(tried_and_lost)
    parsed = trace if isinstance(trace, ParsedTrace) else load_trace(trace)
    precision = result.config.precision if result is not None else None
    profile = summarize(parsed, precision)
    graph = OpGraph(parsed, profile.start_us, profile.end_us)
    operators = operator_view(parsed, profile.start_us, profile.end_us, profile.steps, precision, graph)
    ctx = Context(trace=parsed, profile=profile, result=result, tried_and_lost=lost, graph=graph,
                  operators=operators)
    diagnosis = decide(ctx, run_rules(ctx))
    diagnosis.source = {"trace": parsed.path, "result": getattr(result, "path", None)}
    return diagnosis


def diagnose_result(result, tried_and_lost: Iterable[str] = ()) -> Diagnosis:
    """The diagnosis of a result without a trace (a `perflab serve` result): only the result rules run."""
    ctx = Context(trace=None, profile=None, result=result, tried_and_lost=_lever_names(tried_and_lost))
    diagnosis = decide(ctx, run_rules(ctx))
    diagnosis.source = {"trace": None, "result": getattr(result, "path", None)}
    return diagnosis


def _lever_names(names: Iterable[str]) -> frozenset[str]:
    """The given lever names, checked against `perflab levers`."""
    names = frozenset(names)
    if names:
        known = {lever.name for lever in all_levers()}
        unknown = sorted(names - known)
        if unknown:
            raise PerflabError(f"unknown lever(s) in tried_and_lost: {', '.join(unknown)}; "
                               f"known levers: {', '.join(sorted(known))}")
    return names


def find_trace(path: Union[str, Path]) -> tuple[Path, Optional[Path]]:
    """(trace file, result.json or None) for a run directory or a trace file.

    Next to a trace file `X.json[.gz]`, `X.result.json` (fixtures) or the run's `result.json` is used.
    """
    path = Path(path)
    if path.is_dir():
        trace = next((path / name for name in TRACE_NAMES if (path / name).is_file()), None)
        if trace is None:
            raise PerflabError(f"{path} has no trace.json: record one with `perflab profile` (a `perflab run` "
                               "directory has result.json only)")
        result = path / "result.json"
        return trace, result if result.is_file() else None
    if not path.is_file():
        raise PerflabError(f"no such run directory or trace: {path}")
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    for candidate in (path.parent / f"{stem}.result.json", path.parent / "result.json"):
        if candidate.is_file() and (candidate.name != "result.json" or path.name in TRACE_NAMES):
            return path, candidate
    return path, None


def diagnose_path(path: Union[str, Path], tried_and_lost: Iterable[str] = ()):
    """(Diagnosis, Result or None) for a run directory or a trace file."""
    if Path(path).is_dir() and is_serve_result(Path(path)):
        result = Result.load(path)
        return diagnose_result(result, tried_and_lost), result
    trace, result_path = find_trace(path)
    result = Result.load(result_path) if result_path else None
    return diagnose(trace, result, tried_and_lost), result


__all__ = ["diagnose", "diagnose_result", "diagnose_path", "find_trace", "Diagnosis", "Finding", "CLASS_SLUGS",
           "DIAGNOSIS_FILE"]

"""The starting point's trial, read: why it gives nothing to tune from (an error for the user), or what the notes
say of it (it failed its own quality gate, it breaks the constraints)."""
from __future__ import annotations

from pathlib import Path

from perflab.config import RunConfig
from perflab.errors import OutOfMemoryFailure, PerflabError
from perflab.oom import OutOfMemory
from perflab.results import Result
from perflab.tune.decision import constraint_violations
from perflab.tune.objective import SERVE, max_qps_of
from perflab.tune.record import TrialRecord
from perflab.tune.rows import TrialRow
from perflab.tune.settings import TuneConfig
from perflab.tune.trial import OOM, QUALITY_FAIL, TIMEOUT


def start_trial_config(start: RunConfig) -> RunConfig:
    """The start as its trial runs it: without the quality gate unless --check-quality asks for it. The start is the
    user's own configuration, the reference every gain is read against; tune gates what it changes (every candidate
    against fp32 eager), and a start already in bf16 would otherwise pay for an fp32 eager run of the whole model
    before the first lever (110 of the 150 s of a 4-GPU 1.1B start, BENCHMARKS.md)."""
    return start.replace(check_quality=False) if start.check_quality is None else start


def start_notes(record: TrialRecord, settings: TuneConfig, measure: str, out: Path) -> list[str]:
    """What the notes say of the start's trial; PerflabError when it gives nothing to tune from."""
    row, result = record.row, record.result
    if result is None:
        raise start_failed(row, settings, out)
    if measure == SERVE and max_qps_of(result) is None:
        raise PerflabError(f"the starting point meets no rate with p99 under --p99-ms "
                           f"{settings.serve.p99_ms:g} ({row.search_skipped or 'every rate tried failed'})"
                           f"; raise --p99-ms (see {out / row.dir})")
    notes = []
    if row.status == QUALITY_FAIL:
        notes.append(f"the starting point itself failed its quality gate ({row.reason}); every "
                     "candidate is still gated against the fp32 eager baseline")
    broken = constraint_violations(result, settings.max_p99_ms, settings.max_memory_gb)
    if broken:  # said once: every candidate is held to a bound the start itself does not meet
        notes.append(f"the starting point itself breaks the constraints ({'; '.join(broken)}): a lever is "
                     "kept only if its run meets them; loosen them to tune from here")
    return notes


def start_failed(row: TrialRow, settings: TuneConfig, out: Path) -> PerflabError:
    """Why the starting point gave nothing to tune from: it did not finish in the budget, ran out of memory,
    or failed."""
    if row.status == TIMEOUT:
        return PerflabError(f"the starting point did not finish within --budget {settings.budget} "
                            f"({row.wall_s:.0f} s; the budget is a promise, and every trial is stopped when "
                            f"it runs out): give a larger --budget (see {out / row.dir}.log)")
    if row.status == OOM:
        return start_out_of_memory(row, out)
    return PerflabError(f"the starting point did not run ({row.status}: {row.reason}); see "
                        f"{out / row.dir}.log")


def start_out_of_memory(row: TrialRow, out: Path) -> PerflabError:
    """The starting point did not fit: its own record (the short block, exit code 3) when its run saved one."""
    path = out / row.dir / "result.json"
    record = getattr(Result.load(path.parent), "out_of_memory", None) if path.is_file() else None
    if not record:
        return OutOfMemoryFailure(f"the starting point ran out of memory ({row.reason}); see "
                                  f"{out / row.dir}.log", {"message": row.reason, "device": "?"})
    return OutOfMemory.from_dict(record).failure()

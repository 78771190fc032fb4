"""Area "tune_regret": how much of the available win tune finds, against every single lever measured by hand.

    BENCH_REGRET_ONLY=tiny_ops python -m benchmarks.bench_tune_regret --out DIR          # one planted workload
    BENCH_REGRET_ONLY=resnet50 BENCH_REGRET_STEP=singles python -m benchmarks.bench_tune_regret --out DIR
    BENCH_REGRET_ONLY=resnet50 BENCH_REGRET_STEP=tune BENCH_REGRET_SLICE_S=540 python -m ... --out DIR  # twice
    BENCH_REGRET_ONLY=tiny_ops python -m benchmarks.bench_tune_regret --out DIR --quick  # CPU smoke run (big levers)

Per workload, from fp32 eager (the starting point):
- fp32 eager with all its trials (the start every ratio divides by), then every applicable single lever once (one
  trial process each, one timed trial with a short --min-trial-s, no quality gate: the screen's measurement), and
  the pairs of the three best single levers;
- `perflab tune` with the workload's budget (3 minutes for the planted workloads of tests/planted, 10 minutes for
  resnet50 infer and driving train; resnet50 with --tune-batch, TUNE_OPTIONS), timed from outside (its own wall time,
  report included);
- fp32 eager once more after the rest: the yardstick's own noise (a single lever inside it gets no share);
- tune's gain as a share of the best single lever's gain and of the best pair's (gain = speed-up - 1, every gain over
  the same start: the median of the bench's two measurements of fp32 eager and tune's own start), and how far tune's
  wall time went past its budget.

Choose workloads with BENCH_REGRET_ONLY (comma-separated names: the planted files' names, each also as NAME@infer
for --mode infer, resnet50, driving; default: the planted ones, in training) and the steps with BENCH_REGRET_STEP (singles, tune or both; default both). Measurements are kept
under --out/<card>/<workload> (singles.jsonl, the tune folder; <card> is H100, H200 or cpu) and reused by a later
call with the same --out on the same kind of card, so a workload whose tune does not fit one device call runs in
slices: BENCH_REGRET_SLICE_S interrupts the tune after that many seconds (Ctrl-C, as a user would), and the next
call resumes it (the recorded trials count against its budget); a finished tune is reported again, not rerun.
BENCH_REGRET_DEADLINE_S packs one device call: a workload starts only while its step still fits before that many
seconds, and a tune running at the deadline is sliced there. A planted workload takes about 6 minutes on an H100
(singles ~2.5, tune 3). On the device, copy the carried folder to a fresh --out
(`rm -rf /tmp/reg; cp -r .devresults/regret/reg /tmp/reg`): a warm machine keeps /tmp between calls, and `cp -r`
into an existing folder nests the copy, so the old measurements would be read. The short table is printed last.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.bench_tune_planted import PLANTED, WORKLOADS as PLANTED_WORKLOADS
from benchmarks.common import Rows, parse_args
from perflab.config import RunConfig
from perflab.levers import all_levers
from perflab.pipeline import resolve_config
from perflab.tune import TuneConfig, tune
from perflab.tune import candidates as search
from perflab.tune.candidates import usable_cpus
from perflab.tune.screen_order import INSURANCE
from perflab.tune.screening import screen_config
from perflab.tune.trial import OK, run_trial

# Every planted workload of tests/planted beyond the tune_planted area's, except the failure fixtures
# (fails_on_rank1, stalls_on_rank1, oom_over_batch: processes that fail, not performance cases); big_gradients runs as
# one process here. All start from fp32 eager, as the issue asks.
NOT_PERFORMANCE_CASES = {"fails_on_rank1", "stalls_on_rank1", "oom_over_batch", "planted_common", "__init__"}
PLANTED_EXTRA = [(path.stem, {}, {}) for path in sorted(PLANTED.glob("*.py"))
                 if path.stem not in NOT_PERFORMANCE_CASES | {name for name, _, _ in PLANTED_WORKLOADS}]
SINGLES_ESTIMATE_S = 170.0  # a planted workload's singles and pairs on an H100 (tiny_ops: 150 s)
SINGLES_FILE = "singles.jsonl"
PAIRS_FROM = 3  # the pairs of the best three single levers
BASE_AGAIN = "fp32 eager (again)"  # the start measured once more after the rest: its noise
SINGLE_LIMIT_S = 240.0  # one lever's trial at most (max-autotune is left out: minutes of compiling)
COMPILE_MODES = ("default", "reduce-overhead")
INFER_SUFFIX = "@infer"  # BENCH_REGRET_ONLY=elementwise_chain@infer: a planted workload in --mode infer
# tune's own options per workload: resnet50 infer's 8x goal counts the batch among its levers (issue 26: "CUDA graphs,
# max-autotune and the batch are the rest"), as a user after throughput would run it
TUNE_OPTIONS: dict[str, dict[str, Any]] = {"resnet50": {"tune_batch": True}}


def workloads(cuda: bool, quick: bool) -> dict[str, tuple[RunConfig, str]]:
    """name -> (fp32 eager starting point, tune budget)."""
    full = cuda and not quick
    timing = dict(steps=15, trials=3, warmup=3, quality_steps=3) if full else dict(steps=4, trials=3, warmup=2,
                                                                                   quality_steps=2)
    timing["device"] = "cuda" if cuda else "cpu"  # concrete: which levers apply depends on it
    chosen = {}
    for name, options, extra in PLANTED_WORKLOADS + PLANTED_EXTRA:
        chosen[name] = (RunConfig(workload=f"{PLANTED / name}.py:build", mode="train", workload_options=options,
                                  **{**timing, "min_trial_s": 1.0, **extra}), "3m" if full else "60s")
        # NAME@infer: the same planted model in inference (issue 37's chain of elementwise ops was an inference one)
        chosen[f"{name}{INFER_SUFFIX}"] = (chosen[name][0].replace(mode="infer"), chosen[name][1])
    small = {} if full else {"image_res": "32"}
    chosen["resnet50"] = (RunConfig(workload="resnet50", mode="infer", batch_size=256 if full else 2,
                                    workload_options=small, **timing), "10m" if full else "60s")
    chosen["driving"] = (RunConfig(workload="driving", mode="train", batch_size=32 if full else 2, workers=0,
                                   workload_options=small, **{**timing, "steps": 10 if full else 4}),
                         "10m" if full else "60s")
    return chosen


def single_levers(start: RunConfig, quick: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(label, config changes) for every lever that applies to the start here, one value each (the largest worker
    count, compile's default and reduce-overhead modes); with `quick`, only the big one-flag levers."""
    from perflab.workloads import load_workload

    start = resolve_config(start, None)  # the batch made concrete, as tune's start is
    workload = load_workload(start.workload, start)

    def built_for(cfg: Optional[RunConfig]) -> Any:  # as tune checks: a build-read option on its own build
        return workload if cfg is None else load_workload(cfg.workload, cfg)

    levers = {lever.name: lever for lever in all_levers()}
    chosen: list[tuple[str, dict[str, Any]]] = []
    for lever in levers.values():
        if quick and lever.name not in INSURANCE:
            continue
        proposal = search.Proposal(lever.name, "regret", None, None)
        candidates = search.expand(proposal, lever, start, usable_cpus())
        if lever.option == "workers":
            candidates = candidates[-1:]
        if lever.option == "compile":
            candidates = [c for c in candidates if c.value in COMPILE_MODES and (start.device == "cuda"
                                                                                or c.value == "default")]
        for candidate in candidates:
            cfg = candidate.apply(start)  # with the warm-up its value needs (a compile mode's)
            if search.refusal_before_trying(candidate, cfg, lever, built_for) is None:
                changes = {candidate.option: candidate.value}
                if cfg.warmup != start.warmup:
                    changes["warmup"] = cfg.warmup
                chosen.append((candidate.label, changes))
    return chosen


def _measured(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / SINGLES_FILE
    if not path.is_file():
        return {}
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return {row["label"]: row for row in map(json.loads, lines)}


def measure(folder: Path, label: str, cfg: RunConfig, done: dict[str, dict[str, Any]],
            every_trial: bool = False) -> dict[str, Any]:
    """One trial process of `cfg` (a screen's measurement: one short trial; with `every_trial`, all of cfg's trials,
    as the start every gain is read from is measured), recorded in singles.jsonl; reused when recorded."""
    if label in done:
        return done[label]
    measured = cfg.replace(check_quality=False) if every_trial else screen_config(cfg)
    outcome = run_trial(measured, "run", folder / "trials" / label.replace("=", "-").replace("+", "_"),
                        time_limit_s=SINGLE_LIMIT_S)
    throughput = None
    if outcome.status == OK:
        throughput = outcome.result.metrics.throughput
    row = {"label": label, "status": outcome.status, "throughput": throughput, "wall_s": round(outcome.wall_s, 1),
           "reason": outcome.reason, "trials": measured.trials}
    with open(folder / SINGLES_FILE, "a") as stream:
        stream.write(json.dumps(row) + "\n")
    done[label] = row
    print(f"  {label}: {outcome.status} {throughput} samples/s ({outcome.wall_s:.0f} s)", flush=True)
    return row


def singles_and_pairs(folder: Path, start: RunConfig, quick: bool) -> dict[str, Any]:
    """The start, every single lever and the pairs of the best three, each measured once."""
    done = _measured(folder)
    # the start every ratio divides by, with all its trials: one trial of it moved 29% between the bench's first and
    # last (pageable_inputs, H200: 1,618 then 2,095 samples/s), and the low one had made pin-memory read 5.36x
    # where the same 8,665 samples/s is 4.1x of the other
    base = measure(folder, "fp32 eager", start, done, every_trial=True)
    singles = {label: (changes, measure(folder, label, start.replace(**changes), done))
               for label, changes in single_levers(start, quick)}
    ranked = sorted(((row["throughput"], label) for label, (_, row) in singles.items() if row["throughput"]),
                    reverse=True)
    top: list[str] = []
    for _, label in ranked:  # distinct options: two values of one option are not a pair
        if all(set(singles[label][0]) - {"warmup"} != set(singles[other][0]) - {"warmup"} for other in top):
            top.append(label)
        if len(top) == PAIRS_FROM:
            break
    pairs = {}
    for index, first in enumerate(top):
        for second in top[index + 1:]:
            changes = {**singles[first][0], **singles[second][0]}
            changes["warmup"] = max(singles[first][0].get("warmup", start.warmup),
                                    singles[second][0].get("warmup", start.warmup))
            pairs[f"{first}+{second}"] = measure(folder, f"{first}+{second}", start.replace(**changes), done)
    again = measure(folder, BASE_AGAIN, start, done, every_trial=True)  # the start once more: its own noise
    return {"base": base, "again": again, "singles": {label: row for label, (_, row) in singles.items()},
            "pairs": pairs}


def noise_pct(measured: dict[str, Any], tune_start: Optional[float] = None) -> Optional[float]:
    """How far the measurements of fp32 eager (the bench's first and last, and tune's own start) lie apart, in % of
    the lowest; None with fewer than two."""
    starts = start_measurements(measured, tune_start)
    return 100 * (max(starts) / min(starts) - 1) if len(starts) >= 2 else None


def start_measurements(measured: dict[str, Any], tune_start: Optional[float] = None) -> list[float]:
    """Every measurement of the starting point: the bench's before the singles and after them, and tune's start."""
    found = [measured["base"].get("throughput"), (measured.get("again") or {}).get("throughput"), tune_start]
    return [value for value in found if value]


def common_start(measured: dict[str, Any], tune_start: Optional[float] = None) -> Optional[float]:
    """The start every gain is measured from: the median of its measurements. One single trial of fp32 eager moved
    29% between the bench's first and last (pageable_inputs, H200), and tune's gain over its own start beside the
    singles' gain over the bench's first read 71% of the best single for the same lever at the same throughput."""
    starts = start_measurements(measured, tune_start)
    return statistics.median(starts) if starts else None


def above_noise(speedup: Optional[float], noise: Optional[float]) -> bool:
    """Whether a single trial's speed-up over the single fp32-eager trial is larger than that trial's noise."""
    return speedup is not None and (noise is None or 100 * (speedup - 1) > noise)


def _best(rows: dict[str, dict[str, Any]], base: Optional[float]) -> tuple[Optional[str], Optional[float]]:
    measured = [(row["throughput"], label) for label, row in rows.items() if row.get("throughput")]
    if not measured or not base:
        return None, None
    throughput, label = max(measured)
    return label, throughput / base


class _Slice(Exception):
    pass


def run_tune(folder: Path, start: RunConfig, budget: str, slice_s: Optional[float],
             options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """tune into folder/tune (resumed when a slice of it ran before); its summary and its own wall time."""
    out = folder / "tune"
    resume = (out / "tune.jsonl").is_file()
    timing_file = folder / "tune_wall_s.json"
    if _tune_finished(folder):  # measured in an earlier call: reported again, not rerun
        return {"summary": json.loads((out / "tune.json").read_text()), "wall_s": _timing(folder)["wall_s"],
                "finished": True, "rows": _rows(out)}
    earlier_s = _timing(folder).get("wall_s", 0.0) if resume else 0.0
    if slice_s:
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        signal.alarm(int(slice_s))
    began = time.perf_counter()
    try:
        summary = tune(start, TuneConfig(budget=budget, resume=resume, **(options or {})), out,
                       command=["benchmarks", "tune_regret"])
        finished = True
    except KeyboardInterrupt:
        summary, finished = json.loads((out / "tune.json").read_text()), False
    finally:
        signal.alarm(0)
    wall_s = earlier_s + time.perf_counter() - began
    timing_file.write_text(json.dumps({"wall_s": wall_s, "finished": finished}))
    return {"summary": summary, "wall_s": wall_s, "finished": finished, "rows": _rows(out)}


def _rows(out: Path) -> list[dict[str, Any]]:
    path = out / "tune.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def screen_overhead_s(rows: list[dict[str, Any]]) -> tuple[Optional[float], int]:
    """The median of the warm screens' overhead: wall time less the lever's compile and the measured window (the
    issue asks <= 3 s), and how many screens it is over."""
    costs = sorted(row["wall_s"] - (row.get("compile_s") or 0.0) - row["timed_s"] for row in rows
                   if row.get("warm") and "-screen-" in row.get("name", "") and row.get("timed_s") is not None
                   and row.get("wall_s") is not None)
    return (round(costs[len(costs) // 2], 2) if costs else None), len(costs)


def _timing(folder: Path) -> dict[str, Any]:
    path = folder / "tune_wall_s.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _tune_finished(folder: Path) -> bool:
    return bool(_timing(folder).get("finished")) and (folder / "tune" / "tune.json").is_file()


def _card() -> str:
    """The GPU's model ("H100", "H200"), read without a CUDA context in this process (each trial would count
    one as a neighbour on its GPU); "cpu" without a GPU."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return next((word for word in names if word[:1] in "ABHL" and word[1:].isdigit()), names[0] if names else "cpu")


def share(tuned: Optional[float], reference: Optional[float]) -> Optional[float]:
    """tune's gain as a share of a reference gain (speed-ups; gain = speed-up - 1), in %."""
    if tuned is None or reference is None or reference <= 1.0:
        return None
    return 100 * (tuned - 1) / (reference - 1)


def run(out: Path, quick: bool) -> list[dict]:
    rows = Rows("tune_regret", out)
    chosen = workloads(torch.cuda.is_available(), quick)
    only = [name for name in os.environ.get("BENCH_REGRET_ONLY", "").split(",") if name]
    names = only or [name for name, _, _ in PLANTED_WORKLOADS + PLANTED_EXTRA]
    steps = os.environ.get("BENCH_REGRET_STEP", "singles,tune").split(",")
    slice_s = float(os.environ["BENCH_REGRET_SLICE_S"]) if os.environ.get("BENCH_REGRET_SLICE_S") else None
    deadline = (time.perf_counter() + float(os.environ["BENCH_REGRET_DEADLINE_S"])
                if os.environ.get("BENCH_REGRET_DEADLINE_S") else None)
    card = _card()
    table = []
    for name in names:
        start, budget = chosen[name]
        budget = os.environ.get("BENCH_REGRET_BUDGET") or budget  # issue 37: 2m for the planted ones, 5m for resnet50
        folder = out / card / name  # singles and tune of one workload on one kind of card (H100 or H200)
        folder.mkdir(parents=True, exist_ok=True)
        left = None if deadline is None else deadline - time.perf_counter()
        finished = _tune_finished(folder)
        if left is not None and not finished and left < (SINGLES_ESTIMATE_S if "singles" in steps
                                                         and not _measured(folder) else 60.0):
            print(f"=== {name}: left for a later call ({left:.0f} s of the deadline left)", flush=True)
            continue
        print(f"=== {name}: budget {budget}", flush=True)
        measured = singles_and_pairs(folder, start, quick) if "singles" in steps else None
        tuned = None
        if "tune" in steps:
            left = None if deadline is None else deadline - time.perf_counter()
            # a whole tune in one call where it can be: a resumed slice restarts its trial in flight
            whole_s = TuneConfig(budget=budget).budget_s * 1.05 + 20
            if finished or left is None or left >= whole_s or (slice_s and left >= 60):
                tuned = run_tune(folder, start, budget, slice_s if left is None else min(slice_s or left, left),
                                 TUNE_OPTIONS.get(name))
            else:
                print(f"=== {name}: tune left for a later call ({left:.0f} s of the deadline left)", flush=True)
        table.append(record(rows, name, budget, measured, tuned))
    print("\nworkload | budget | best single | best pair | tune | tune took | tune/single | tune/pair | noise | kept | "
          "warm screen overhead")
    for line in table:
        print(line, flush=True)
    return rows.rows


def record(rows: Rows, name: str, budget: str, measured: Optional[dict[str, Any]],
           tuned: Optional[dict[str, Any]]) -> str:
    """The rows of one workload, and its line of the closing table."""
    single = pair = (None, None)
    summary = (tuned or {}).get("summary") or {}
    tune_start = (summary.get("start") or {}).get("throughput")
    tune_best = (summary.get("best") or {}).get("throughput")
    base = common_start(measured, tune_start) if measured is not None else None
    if measured is not None:
        single, pair = _best(measured["singles"], base), _best(measured["pairs"], base)
        rows.add(name, "fp32 eager", base, "samples/s", "the median of the start's measurements: "
                 f"{', '.join(f'{value:.1f}' for value in start_measurements(measured, tune_start))}")
        for label, row in {**measured["singles"], **measured["pairs"]}.items():
            value = row["throughput"] / base if row.get("throughput") and base else None
            rows.add(name, f"lever {label}", value, "x", f"{row['status']}; {row['wall_s']} s")
    speedup = took = overhead = None
    kept = ""
    if tuned is not None:
        speedup, took = summary.get("speedup"), tuned["wall_s"]
        kept = ", ".join(summary.get("kept") or []) or "nothing"
        budget_s = summary.get("budget_s") or 0
        rows.add(name, "tune speed-up", speedup, "x", f"kept: {kept}; stopped: {summary.get('stop_reason')}")
        rows.add(name, "tune wall time", round(took, 1), "s", f"budget {budget_s:.0f} s; over by "
                 f"{100 * (took / budget_s - 1) if budget_s else 0:+.1f}%"
                 + ("" if tuned["finished"] else "; interrupted slice: run again with the same --out"))
        for entry in summary.get("screened") or []:
            rows.add(name, f"screened {entry['label']}", entry.get("screened_gain_pct"), "% gain", entry["outcome"])
        overhead, screens = screen_overhead_s(tuned.get("rows") or [])
        rows.add(name, "warm screen overhead (median)", overhead, "s",
                 f"{screens} warm screens: wall time less compile and the measured window")
    noise = noise_pct(measured, tune_start) if measured is not None else None
    if noise is not None:
        rows.add(name, "fp32 eager noise", noise, "%", "the start's measurements: the bench's first and last single "
                 "trials and tune's start, highest over lowest")
    # tune's gain over the same start as the singles' (its best's throughput over the common start); a tune.json
    # without its best's throughput gives its own speed-up
    tuned_gain = tune_best / base if tune_best and base else speedup
    if tuned is not None:
        rows.add(name, "tune best over the common start", tuned_gain, "x",
                 f"best {tune_best} samples/s over {base} (tune's own start: {tune_start})")
    shares = [share(tuned_gain, single[1]) if above_noise(single[1], noise) else None,
              share(tuned_gain, pair[1]) if above_noise(pair[1], noise) else None]
    inside = f"within the noise ({noise:.0f}%)" if noise is not None else "n/a"
    rows.add(name, "tune share of best single", shares[0], "%", f"best single {single[0]} {single[1]}" +
             (f"; {inside}" if shares[0] is None and (single[1] or 0.0) > 1.0 else ""))
    rows.add(name, "tune share of best pair", shares[1], "%", f"best pair {pair[0]} {pair[1]}")

    def fmt(value: Optional[float], unit: str = "x") -> str:
        return "n/a" if value is None else f"{value:.2f}{unit}"

    def fmt_share(value: Optional[float], reference: Optional[float]) -> str:
        gain_inside_noise = reference is not None and reference > 1.0 and not above_noise(reference, noise)
        return inside if value is None and gain_inside_noise else fmt(value, "%")
    return (f"{name} | {budget} | {single[0]} {fmt(single[1])} | {pair[0]} {fmt(pair[1])} | {fmt(speedup)} | "
            f"{fmt(took, ' s')} | {fmt_share(shares[0], single[1])} | {fmt_share(shares[1], pair[1])} | "
            f"{'n/a' if noise is None else f'{noise:.1f}%'} | {kept} | {fmt(overhead, ' s')}")


if __name__ == "__main__":
    args = parse_args()
    run(args.out, args.quick)

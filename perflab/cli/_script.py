"""`perflab run|profile [options] -- python train.py ARGS`: the user's script, run unchanged with perflab attached."""
from __future__ import annotations

import argparse
import sys
from contextlib import suppress
from typing import Optional

from rich.markup import escape

from perflab import options
from perflab.cli import NEGATIVE_VALUE, console, debug_enabled, err_console
from perflab.errors import PerflabError
from perflab.profile.capture import CaptureOptions
from perflab.report.diagnosis import print_diagnosis
from perflab.report.terminal import print_result
from perflab.results.rundir import run_dir
from perflab.script import parse_command, run_script
from perflab.script.command import check_command

DEFAULT_WARMUP = 5  # as `perflab run`: the script's first steps (allocator growth, autotuning) are not timed
SCRIPT_OPTIONS = {"--out", "--warmup", "--overwrite"}
PROFILER_OPTIONS = options.flags_of(CaptureOptions, "profile")  # every spelling of `perflab profile`'s own options
EPILOG = ("A script of your own, unchanged: `%(prog)s [--out DIR] [--warmup N] -- python train.py ARGS` "
          "(or `-- python -m package.module ARGS`). Steps are found at each optimizer step (or each call of the "
          "outermost model, or each `perflab.mark(\"step\")`); see docs/scripts.md.")


def split_script_command(argv: list[str]) -> tuple[list[str], Optional[list[str]]]:
    """(perflab's arguments, the script command after the first `--`, or None when there is no `--`)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def _check_options(perflab_argv: list[str], profiling: bool) -> None:
    allowed = SCRIPT_OPTIONS | (PROFILER_OPTIONS if profiling else set())
    for word in perflab_argv[1:]:
        flag = word.partition("=")[0]
        if word.startswith("-") and not NEGATIVE_VALUE.match(word) and flag not in allowed:
            raise PerflabError(f"{flag} does not apply to a script (the script sets up its own model and data); "
                               f"with `-- python script.py` use {', '.join(sorted(allowed))}")


def handle_script(args: argparse.Namespace, capture: Optional[CaptureOptions]) -> int:
    """Run args.script_command with perflab attached; print the summary (and diagnosis); return its exit code."""
    perflab_argv, _ = split_script_command(args.argv)
    _check_options(perflab_argv, capture is not None)
    warmup = DEFAULT_WARMUP if args.warmup is None else args.warmup
    if warmup < 0:
        raise PerflabError(f"--warmup {warmup}: give 0 or more steps")
    command = check_command(parse_command(args.script_command))
    what = "steps, phases, NVML" + (", trace" if capture is not None else "")
    err_console.print(f"perflab: running [bold]{escape(' '.join(command.shown()))}[/] ({what})", highlight=False)
    with run_dir(args.out, command.name, args.overwrite) as out:
        outcome = run_script(command, out, warmup, capture, perflab_argv)
    if outcome.traceback and (outcome.out_of_memory is None or debug_enabled(args)):
        sys.stderr.write(outcome.traceback)
    if outcome.out_of_memory is not None:
        err_console.print(escape(outcome.out_of_memory.block()), highlight=False, soft_wrap=True)
        if outcome.result is None:
            with suppress(OSError):
                out.rmdir()  # only when empty: no step finished before the OOM
        return outcome.exit_code
    result = outcome.result
    if result is None:
        with suppress(OSError):
            out.rmdir()  # only when empty: nothing was captured
        if outcome.exit_code:
            text = (f"the script stopped (exit {outcome.exit_code}) after {outcome.steps_seen} steps, before a step "
                    f"after the --warmup {warmup} finished")
        else:
            text = (f"the script ran {outcome.steps_seen} steps, no more than --warmup {warmup}, so none was timed: "
                    "lower --warmup, or let the script run longer (steps are counted at optimizer steps, outermost "
                    "model calls or perflab.mark(\"step\"); see docs/scripts.md)")
        err_console.print(f"perflab: {text}; nothing saved", highlight=False, soft_wrap=True)
        return outcome.exit_code or 1
    print_result(console, result)
    if outcome.diagnosis is not None:
        print_diagnosis(console, outcome.diagnosis)
        for lever, code in result.diagnosis.get("levers_in_code", {}).items():
            console.print(f"in your script, {lever}: {escape(code)}", highlight=False)
        console.print(f"trace: [bold]{escape(str(out / result.artifacts['trace']))}[/] (open in "
                      "https://ui.perfetto.dev)")
    if result.status == "invalid":  # NaN never passes: the script's own exit code, or 1 when it exited 0
        err_console.print(f"[bold red]invalid run[/]: {escape(result.status_reason)}; saved in {escape(str(out))} "
                          "(result.json marked invalid)", highlight=False)
        return outcome.exit_code or 1
    return outcome.exit_code

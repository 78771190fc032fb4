"""perflab profile: a run with a scheduled torch.profiler capture, the nsys command, and the diagnosis."""
from __future__ import annotations

import argparse
import shlex

from rich.markup import escape

from perflab import options as option_table
from perflab.cli import console, err_console
from perflab.cli._options import add_rank_mode, add_run_options, config_from_args
from perflab.cli._outcome import finish_run
from perflab.cli._script import EPILOG, handle_script
from perflab.cli.run import launcher_or_rich_reporter, rank_reporter
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from perflab.report.diagnosis import print_diagnosis
from perflab.results.rundir import run_dir
from perflab.ranks import is_primary
from perflab.distributed.rank import run_as_rank


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="trace a few steps (torch.profiler, NVTX), print the nsys command, diagnose",
        description="Run a workload with a scheduled torch.profiler capture of a few timed steps; save "
                    "runs/<id>/ with result.json, trace.json (open in Perfetto) and diagnosis.json; print the "
                    "diagnosis and the Nsight Systems command for the same run.", epilog=EPILOG)
    add_run_options(parser, "profile")
    option_table.add_arguments(parser, CaptureOptions, "profile")
    add_rank_mode(parser)
    parser.set_defaults(handler=handle, runs_scripts=True)


def handle(args: argparse.Namespace) -> int:
    options = capture_options_from_args(args)
    if args.script_command is not None:
        return handle_script(args, capture=options.check(options.steps_needed))
    if args.rank_mode:
        return profile_rank(config_from_args(args), options, args)
    cfg = resolve_config(config_from_args(args), None)
    options.check(cfg.steps)
    with run_dir(args.out, cfg.workload, args.overwrite, cfg.resume_from) as out, \
            launcher_or_rich_reporter(cfg) as reporter:
        result, diagnosis, command = profile_run(cfg.workload, cfg, out, options, reporter=reporter,
                                                 command=["perflab"] + args.argv)
    if result is None:
        console.print("this node's ranks finished; node 0 writes the result, traces and diagnosis in its --out")
        return 0
    code = finish_run(console, err_console, result, out)
    if diagnosis is not None:
        print_diagnosis(console, diagnosis)
    if "trace" in result.artifacts:
        console.print(f"trace: [bold]{escape(str(out / result.artifacts['trace']))}[/] (open in "
                      "https://ui.perfetto.dev)")
    console.print("Nsight Systems, for the same run (where nsys is installed):\n  " + escape(shlex.join(command)),
                  highlight=False, soft_wrap=True)
    return code


def capture_options_from_args(args: argparse.Namespace) -> CaptureOptions:
    """The profiler options given on the command line; the others keep CaptureOptions' defaults."""
    capture = CaptureOptions(**option_table.changes_from_args(CaptureOptions, args, "profile"))
    option_table.validate(capture)
    return capture


def profile_rank(cfg, options: CaptureOptions, args: argparse.Namespace) -> int:
    """One rank of `perflab profile --nproc N`: each rank writes its trace; rank 0 diagnoses and saves."""
    def body() -> None:
        with rank_reporter(is_primary()) as reporter:
            profile_run(cfg.workload, resolve_config(cfg, None), args.out, options, reporter=reporter,
                        command=["perflab"] + args.argv)
    return run_as_rank(cfg.device, body)

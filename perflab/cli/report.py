"""perflab report DIR: report.md and a self-contained report.html for a run, a sweep or a comparison."""
from __future__ import annotations

import argparse

from perflab.cli import console
from perflab.errors import writing
from perflab.report.build import write_report


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="write report.md and a self-contained report.html (plots embedded) for a run/sweep/compare",
        description="Turn a run, sweep or compare directory into report.md and one self-contained report.html "
                    "(plots embedded as images, inline CSS, opens without network) with the environment, the "
                    "config, the tables, the plots, the diagnosis and the decision.")
    parser.add_argument("directory", metavar="DIR", help="a run, sweep or compare directory")
    parser.add_argument("--out", default=None, metavar="DIR", help="write the report here (default: DIR itself)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    with writing(args.out or args.directory, "the report"):
        files = write_report(args.directory, args.out)
    console.print("wrote " + ", ".join(f"[bold]{path}[/]" for path in files))
    return 0

"""perflab diagnose: name the bottleneck of a profiled run (or of any torch.profiler Chrome trace)."""
from __future__ import annotations

import argparse
from pathlib import Path

from perflab.cli import console
from perflab.diagnose import DIAGNOSIS_FILE, diagnose_path
from perflab.report.diagnosis import diagnosis_markdown, print_diagnosis
from perflab.results import write_json_atomic


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose", help="name the bottleneck of a profiled run, with evidence and levers",
        description="Read runs/<id>/ (trace.json + result.json from `perflab profile`) or a Chrome trace "
                    "(.json or .json.gz) and name the bottleneck from the map, with this run's numbers.")
    parser.add_argument("path", metavar="RUN_DIR_OR_TRACE")
    parser.add_argument("--markdown", action="store_true", help="print the Markdown section instead of tables")
    parser.add_argument("--no-save", action="store_true",
                        help="do not write diagnosis.json into the run directory")
    parser.add_argument("--tried-and-lost", metavar="LEVER,...", default="",
                        help="levers already measured on this run that did not win (names from `perflab levers`): "
                             "not proposed again; the diagnosis says what is left instead")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    lost = [name.strip() for name in args.tried_and_lost.split(",") if name.strip()]
    diagnosis, result = diagnose_path(args.path, tried_and_lost=lost)
    path = Path(args.path)
    if path.is_dir() and not args.no_save:
        write_json_atomic(path / DIAGNOSIS_FILE, diagnosis.to_dict())
        if result is not None:
            result.diagnosis = diagnosis.to_dict()
            result.artifacts["diagnosis"] = DIAGNOSIS_FILE
            result.save(path)
    if args.markdown:
        console.print(diagnosis_markdown(diagnosis), markup=False, highlight=False)
    else:
        print_diagnosis(console, diagnosis)
    return 0

"""Nsight Systems: the exact `nsys profile ...` command for a run, and the cudaProfilerStart/Stop range.

perflab never runs nsys itself; it writes the command (nsys_command.txt) so the user can run it where
Nsight Systems is installed. The command runs `perflab run <same options> --nsys SKIP:ACTIVE`, and with
`--nsys` the harness calls cudaProfilerStart after SKIP timed steps and cudaProfilerStop ACTIVE steps later,
so `--capture-range=cudaProfilerApi` records only those steps (NVTX ranges from perflab.mark included).
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import torch

from perflab.errors import PerflabError
from perflab.hooks import StepHook

COMMAND_FILE = "nsys_command.txt"
DEFAULT_RANGE = "2:3"


def parse_range(text: str) -> tuple[int, int]:
    """'SKIP:ACTIVE' -> (skip, active), both counted in timed steps."""
    skip, _, active = text.partition(":")
    try:
        values = (int(skip), int(active))
    except ValueError:
        values = (-1, -1)
    if values[0] < 0 or values[1] <= 0:
        raise PerflabError(f"--nsys expects SKIP:ACTIVE timed steps like {DEFAULT_RANGE}, got {text!r}")
    return values


def nsys_command(run_dir: Path, cfg, skip: int, active: int) -> list[str]:
    """`nsys profile ...` recording `active` timed steps after `skip` of `perflab run` with the same config."""
    run_dir = Path(run_dir)
    if cfg.nproc > 1 or cfg.nnodes > 1:  # nsys follows the launcher's rank processes; each records itself whole
        return ["nsys", "profile", "-t", "cuda,nvtx,osrt", "-o", str(run_dir / "nsys"), "--force-overwrite=true",
                "perflab", "run", *cfg.to_argv("run"), "--out", str(run_dir / "nsys_run")]
    return ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "-o", str(run_dir / "nsys"), "--force-overwrite=true",
            "perflab", "run", *cfg.replace(nsys=None).to_argv("run"), "--out", str(run_dir / "nsys_run"),
            "--nsys", f"{skip}:{active}"]


def save_nsys_command(run_dir: Path, command: list[str]) -> Path:
    """Write the command, shell-quoted on one line, to run_dir/nsys_command.txt."""
    path = Path(run_dir) / COMMAND_FILE
    path.write_text(shlex.join(command) + "\n")
    return path


class CudaProfilerRange(StepHook):
    """Calls cudaProfilerStart after `skip` timed steps and cudaProfilerStop `active` steps later (CUDA only)."""

    def __init__(self, skip: int, active: int):
        self.skip, self.active = skip, active
        self.cuda = False
        self.running = False
        self.recorded = 0

    def start(self, plan) -> None:
        self.cuda = plan.device.type == "cuda"

    def __enter__(self) -> "CudaProfilerRange":
        if self.skip == 0:
            self._start()
        return self

    def after_step(self, plan, timer, step: int) -> None:
        done = step + 1
        if done == self.skip:
            self._start()
        elif done == self.skip + self.active:
            self._stop()

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        if self.cuda and not self.running:
            torch.cuda.profiler.start()
            self.running = True

    def _stop(self) -> None:
        if self.running:
            torch.cuda.profiler.stop()
            self.running = False
            self.recorded = self.active

    def finish(self, result) -> None:
        if not self.cuda:
            result.notes.append("--nsys: this run is on the CPU, so no CUDA profiler range was opened")
        else:
            result.notes.append(f"--nsys: cudaProfilerStart/Stop around timed steps {self.skip + 1}-"
                                f"{self.skip + self.active} (nsys --capture-range=cudaProfilerApi)")


def nsys_hooks(text: Optional[str]) -> list[StepHook]:
    """The hooks `--nsys [SKIP:ACTIVE]` asks for: none when the option is absent."""
    if not text:
        return []
    return [CudaProfilerRange(*parse_range(text))]

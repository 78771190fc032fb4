"""Run options shared by run, profile and sweep; sweep accepts comma-separated lists (a grid)."""
from __future__ import annotations

import argparse
import itertools
from typing import Any, Callable

from perflab import config as C
from perflab.config import RunConfig
from perflab.errors import PerflabError

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise PerflabError(f"expected on/off (or true/false), got {text!r}")


# dest -> converter from text, for options that take a value.
VALUE_OPTIONS: dict[str, Callable[[str], Any]] = {
    "workload": str, "mode": str, "batch_size": int, "steps": int, "warmup": int, "trials": int,
    "device": str, "seed": int, "data": str, "workers": int, "prefetch_factor": int, "prefetcher": str,
    "precision": str, "compile": str, "augment": str, "pipeline": str, "optimizer_impl": str, "sdpa": str,
    "quality_steps": int, "quality_rtol": float, "quality_loss_rtol": float,
    "checkpoint_every": int, "resume_from": str,
}
# dest -> options that are on/off switches.
SWITCH_OPTIONS = ["sync_phases", "persistent_workers", "pin_memory", "non_blocking", "channels_last",
                  "cuda_graphs", "activation_checkpointing", "check_quality"]


def add_run_options(parser: argparse.ArgumentParser, lists: bool = False) -> None:
    """Add every RunConfig option. With `lists`, each option may be a comma-separated list."""
    value = str if lists else None

    def opt(flag: str, dest: str, help_text: str, choices=None, metavar=None, **extra) -> None:
        kind = value or VALUE_OPTIONS[dest]
        parser_group.add_argument(flag, dest=dest, type=kind, default=None, metavar=metavar,
                                  choices=None if lists else choices, help=help_text, **extra)

    def switch(flag: str, dest: str, help_text: str, negatable: bool = False) -> None:
        if lists:
            parser_group.add_argument(flag, dest=dest, nargs="?", const="on", default=None, metavar="on,off",
                                      help=help_text + " (a list like on,off sweeps both)")
        elif negatable:
            parser_group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                                      help=help_text)
        else:
            parser_group.add_argument(flag, dest=dest, action="store_true", default=None, help=help_text)

    parser_group = parser.add_argument_group("workload and measurement")
    opt("--workload", "workload", "built-in name (see `perflab workloads`) or path/file.py:build or "
        "package.module:build (default: driving)", metavar="NAME")
    opt("--mode", "mode", "train or infer (default: train)", choices=C.MODES)
    opt("--batch", "batch_size", "batch size (default: the workload's, by device)", metavar="N")
    opt("--steps", "steps", "timed steps per trial (default: 30)", metavar="N")
    opt("--warmup", "warmup", "untimed warm-up steps (default: 5)", metavar="N")
    opt("--trials", "trials", "timed trials; medians and spreads are over these (default: 3)", metavar="N")
    opt("--device", "device", "auto, cuda or cpu (default: auto = cuda if present)", choices=C.DEVICES)
    opt("--seed", "seed", "random seed for weights, data order and augmentation (default: 0)", metavar="N")
    opt("--data", "data", "loader: DataLoader over the dataset; device: batches pre-staged on the device "
        "(default: the workload's)", choices=C.DATA_SOURCES)
    parser_group.add_argument("--option", dest="workload_options", action="append", default=None,
                              metavar="KEY=VALUE", help="workload-specific setting, e.g. image_res=128 "
                              "(repeatable)")
    switch("--sync-phases", "sync_phases", "synchronise at phase boundaries for a host-clock breakdown "
           "(adds syncs; off by default)")
    parser_group = parser.add_argument_group("data-path levers")
    opt("--workers", "workers", "DataLoader worker processes (default: 0)", metavar="N")
    switch("--persistent-workers", "persistent_workers", "keep workers alive between epochs")
    opt("--prefetch-factor", "prefetch_factor", "batches loaded ahead per worker", metavar="N")
    switch("--pin-memory", "pin_memory", "page-locked host batches (default: on with CUDA)", negatable=True)
    switch("--non-blocking", "non_blocking", "asynchronous copies from pinned memory (default: on)",
           negatable=True)
    opt("--prefetcher", "prefetcher", "stream: copy the next batch on a side CUDA stream", choices=C.PREFETCHERS)
    parser_group = parser.add_argument_group("model and step levers")
    opt("--precision", "precision", "fp32, tf32, bf16 or fp16 (default: fp32)", choices=C.PRECISIONS)
    switch("--channels-last", "channels_last", "NHWC memory format for convolutions")
    if lists:
        opt("--compile", "compile", "torch.compile mode(s): default, reduce-overhead, max-autotune, none")
    else:
        parser_group.add_argument("--compile", dest="compile", nargs="?", const="default", default=None,
                                  choices=C.COMPILE_MODES, help="torch.compile the model (mode: default)")
    switch("--cuda-graphs", "cuda_graphs", "capture the step as a CUDA graph and replay it")
    opt("--augment", "augment", "cpu, gpu or gpu-stream augmentation (workloads that declare it)",
        choices=C.AUGMENT_MODES)
    opt("--pipeline", "pipeline", "streams: run a frozen front stage one batch ahead on its own stream",
        choices=C.PIPELINES)
    switch("--activation-checkpointing", "activation_checkpointing", "recompute activations in backward")
    opt("--optimizer-impl", "optimizer_impl", "default, foreach or fused", choices=C.OPTIMIZER_IMPLS)
    opt("--sdpa", "sdpa", "attention backend: auto, flash, efficient or math", choices=C.SDPA_BACKENDS)
    parser_group = parser.add_argument_group("quality gate")
    switch("--check-quality", "check_quality", "compare outputs/losses with the fp32 eager baseline "
           "(default: on whenever a lever can change numerics)", negatable=True)
    opt("--quality-steps", "quality_steps", "training steps (train) or batches (infer) the quality gate "
        "compares (default: 8)", metavar="N")
    opt("--quality-rtol", "quality_rtol", "inference: relative output error allowed (default by precision: "
        "fp32 1e-5, tf32 1e-3, bf16 2e-2, fp16 1e-2; see docs/quality.md)", metavar="X")
    opt("--quality-loss-rtol", "quality_loss_rtol", "training: relative final-loss delta allowed (default by "
        "precision; see docs/quality.md)", metavar="X")
    if not lists:
        parser_group = parser.add_argument_group("checkpoints (training)")
        opt("--checkpoint-every", "checkpoint_every", "save model, optimizer, scaler, RNG states and step to "
            "<out>/checkpoint.pt every N timed steps (timed as the 'checkpoint' phase)", metavar="N")
        opt("--resume-from", "resume_from", "load a checkpoint.pt (or a run directory holding one) before "
            "warm-up", metavar="PATH")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="run directory (default: runs/<timestamp>-<workload>)")
    if not lists:
        parser.add_argument("--nsys", nargs="?", const="2:3", default=None, metavar="SKIP:ACTIVE",
                            help="call cudaProfilerStart/Stop around ACTIVE timed steps after SKIP (default "
                            "2:3), for nsys --capture-range=cudaProfilerApi (see `perflab profile`)")


def _workload_options(pairs) -> dict[str, str]:
    options = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise PerflabError(f"--option expects KEY=VALUE, got {pair!r}")
        options[key] = text
    return options


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """A RunConfig from single-valued options; unspecified options keep RunConfig's defaults."""
    changes: dict[str, Any] = {}
    for dest in list(VALUE_OPTIONS) + SWITCH_OPTIONS:
        value = getattr(args, dest, None)
        if value is not None:
            changes[dest] = value
    changes["workload_options"] = _workload_options(getattr(args, "workload_options", None))
    return RunConfig(**changes).validate()


def grid_from_args(args: argparse.Namespace) -> tuple[list[RunConfig], list[str]]:
    """Expand comma-separated options into the grid of RunConfigs, and name the swept fields."""
    axes: dict[str, list[Any]] = {}
    for dest in list(VALUE_OPTIONS) + SWITCH_OPTIONS:
        text = getattr(args, dest, None)
        if text is None:
            continue
        convert = parse_bool if dest in SWITCH_OPTIONS else VALUE_OPTIONS[dest]
        try:
            values = [convert(part.strip()) for part in str(text).split(",") if part.strip()]
        except ValueError:
            raise PerflabError(f"--{dest.replace('_', '-')}: cannot read {text!r} as a list of values") from None
        if dest == "compile":
            values = [None if v == "none" else v for v in values]
        axes[dest] = values
    options = _workload_options(getattr(args, "workload_options", None))
    swept = [dest for dest, values in axes.items() if len(values) > 1]
    configs = [RunConfig(workload_options=dict(options), **dict(zip(axes, combo))).validate()
               for combo in itertools.product(*axes.values())]
    return configs, swept

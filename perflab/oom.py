"""What an out-of-memory record holds (one declaration for run, profile, sweep, tune, serve, scale, scripts).

An OOM is a result, not a traceback: `OutOfMemory.from_error` reads torch's message (what was being allocated,
the device's figures) and the allocator at that moment, `block()` is the short text the CLI prints, and
`to_dict()` is what result.json (status "oom"), a sweep's row and a tune trial record.
"""
from __future__ import annotations

import gc
import re
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from perflab.config import is_full_precision
from perflab.errors import EXIT_OUT_OF_MEMORY, OutOfMemoryFailure

_UNITS = {"bytes": 2**-20, "B": 2**-20, "KiB": 2**-10, "MiB": 1.0, "GiB": 2**10, "TiB": 2**20}
_SIZE = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"
_PATTERNS = {
    "tried_mb": (r"[Tt]ried to allocate " + _SIZE, r"you tried to allocate (\d+) (bytes)"),
    "total_mb": (r"total capacity of " + _SIZE,),
    "allocated_mb": (_SIZE + r" is allocated by PyTorch",),
    "slack_mb": (_SIZE + r" is reserved by PyTorch but unallocated",),
}
OOM_BREAKDOWN_ENV = "PERFLAB_OOM_BREAKDOWN"  # 0: the block's advice stays generic (no breakdown at half the batch)
KEPT_TRACEBACK = "kept_traceback"  # the attribute free_after keeps a let-go traceback's text in
SLACK_SHARE = 0.1  # reserved-but-unallocated beyond this share of the device: fragmentation is worth a lever


def _mb(text: str, patterns: tuple[str, ...]) -> Optional[float]:
    for pattern in patterns:
        found = re.search(pattern, text)
        if found:
            return float(found.group(1)) * _UNITS[found.group(2)]
    return None


def _gib(mb: Optional[float]) -> str:
    return "?" if mb is None else (f"{mb / 1024:.2f} GiB" if mb >= 1024 else f"{mb:.1f} MiB")


@dataclass
class OutOfMemory:
    """One out-of-memory: the figures at that moment, the configuration that hit it, and what would make it fit."""

    message: str  # torch's first line
    device: str
    batch_size: Optional[int] = None
    levers: list[str] = field(default_factory=list)
    tried_mb: Optional[float] = None  # the allocation that failed
    allocated_mb: Optional[float] = None
    reserved_mb: Optional[float] = None
    total_mb: Optional[float] = None
    advice: list[str] = field(default_factory=list)

    @classmethod
    def from_error(cls, err: BaseException, device: Optional[torch.device], cfg: Any = None) -> "OutOfMemory":
        """Parse torch's message; fill what it lacks from the allocator now (before anything is freed)."""
        text = str(err)
        figures = {name: _mb(text, patterns) for name, patterns in _PATTERNS.items()}
        slack = figures.pop("slack_mb")
        if figures["allocated_mb"] is not None and slack is not None:
            figures["reserved_mb"] = figures["allocated_mb"] + slack
        if device is not None and device.type == "cuda" and torch.cuda.is_available():
            figures["allocated_mb"] = figures["allocated_mb"] or torch.cuda.memory_allocated(device) / 2**20
            figures["reserved_mb"] = figures.get("reserved_mb") or torch.cuda.memory_reserved(device) / 2**20
            figures["total_mb"] = figures["total_mb"] or torch.cuda.get_device_properties(device).total_memory / 2**20
        record = cls(message=(text.strip().splitlines() or [type(err).__name__])[0][:300],
                     device=str(device) if device is not None else "?",
                     batch_size=getattr(cfg, "batch_size", None), levers=_levers_of(cfg), **figures)
        record.advice = advice(record, cfg)
        return record

    @property
    def slack_mb(self) -> Optional[float]:
        if self.reserved_mb is None or self.allocated_mb is None:
            return None
        return max(0.0, self.reserved_mb - self.allocated_mb)

    def summary(self) -> str:
        """One line: where and what, for a sweep's row and a tune trial."""
        tried = f" allocating {_gib(self.tried_mb)}" if self.tried_mb is not None else ""
        return (f"out of memory at batch {self.batch_size}{tried} (allocated {_gib(self.allocated_mb)}, reserved "
                f"{_gib(self.reserved_mb)}, total {_gib(self.total_mb)})")

    def block(self) -> str:
        """The short block the CLI prints instead of a traceback."""
        lines = [f"out of memory on {self.device}: " + (f"tried to allocate {_gib(self.tried_mb)}"
                                                        if self.tried_mb is not None else self.message),
                 f"  memory then: allocated {_gib(self.allocated_mb)} / reserved {_gib(self.reserved_mb)} / total "
                 f"{_gib(self.total_mb)}",
                 f"  batch {self.batch_size or '?'}, levers: {', '.join(self.levers) or 'none'}"]
        if self.advice:
            lines.append("  most likely to make it fit:")
            lines += [f"    - {item}" for item in self.advice]
        lines.append(f"  (exit code {EXIT_OUT_OF_MEMORY}; --debug shows the traceback; docs/memory.md)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "slack_mb": self.slack_mb}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OutOfMemory":
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})

    def failure(self, advise: bool = False) -> OutOfMemoryFailure:
        return OutOfMemoryFailure(self.block(), self.to_dict(), advise)


def _levers_of(cfg: Any) -> list[str]:
    if cfg is None or not hasattr(cfg, "to_argv"):
        return []
    argv = cfg.to_argv("run")
    skip = {"--workload", "--mode", "--batch", "--device", "--out", "--steps", "--trials", "--warmup", "--seed",
            "--option"}
    levers, index = [], 0
    while index < len(argv):
        name = argv[index]
        value = argv[index + 1] if index + 1 < len(argv) and not argv[index + 1].startswith("--") else None
        index += 2 if value is not None else 1
        if name not in skip:
            levers.append(name.removeprefix("--") + (f"={value}" if value is not None else ""))
    return levers


def advice(record: OutOfMemory, cfg: Any) -> list[str]:
    """The two or three changes most likely to make this configuration fit, most likely first."""
    items = []
    slack = record.slack_mb
    if slack is not None and record.total_mb and slack > SLACK_SHARE * record.total_mb:
        items.append(f"{_gib(slack)} is reserved but unallocated (fragmentation): "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    batch = record.batch_size
    if batch and batch > 1:
        items.append(f"a smaller batch: --batch {max(1, batch // 2)} (`perflab memory --find-max-batch` finds the "
                     "largest that fits, and what uses the memory)")
    if cfg is not None and getattr(cfg, "mode", None) == "train" and not getattr(cfg, "activation_checkpointing", True):
        items.append("--activation-checkpointing (activations are recomputed in backward, not stored)")
    if cfg is not None and is_full_precision(getattr(cfg, "precision", None)):
        items.append("--precision bf16 (half the bytes for activations)")
    return items[:3]


def free_after(err: BaseException) -> None:
    """Let go of the tensors the failed step still holds, then return the cached blocks to the device.

    Clearing the frames of the tracebacks (of every exception it was raised from or during) is not enough: a
    cleared frame still holds its function, and torch's module call is a closure (`_call_impl.<locals>.inner`)
    over that layer's input, so every layer's activation stayed alive while a traceback did (135 GiB of 139 on an
    H200, and the breakdown at half the batch ran out of memory too). So the tracebacks go as well; their text is
    kept on each exception (`kept_traceback`) for --debug."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if err.__traceback__ is not None:
            setattr(err, KEPT_TRACEBACK, "".join(traceback.format_exception(type(err), err, err.__traceback__,
                                                                            chain=False)))
            traceback.clear_frames(err.__traceback__)
            err.__traceback__ = None
        err = err.__cause__ or err.__context__
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def kept_traceback(err: BaseException) -> str:
    """The traceback text of err and what it was raised from, as Python prints it, read from the text free_after
    kept where it let go of a traceback."""
    chain: list[BaseException] = []
    while err is not None and all(err is not seen for seen in chain):
        chain.append(err)
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    parts = []
    for inner, outer in zip(reversed(chain), [*reversed(chain[:-1]), None]):
        text = getattr(inner, KEPT_TRACEBACK, None) if inner.__traceback__ is None else None
        parts.append(text or "".join(traceback.format_exception(type(inner), inner, inner.__traceback__,
                                                                chain=False)))
        if outer is not None:
            parts.append("\nThe above exception was the direct cause of the following exception:\n\n"
                         if outer.__cause__ is inner else
                         "\nDuring handling of the above exception, another exception occurred:\n\n")
    return "".join(parts)

"""Training checkpoints: save model, optimizer, grad scaler, RNG states and step; resume before warm-up.

A checkpoint is written atomically (torch.save to a temp file in the same directory, then os.replace),
so a kill during a save leaves the previous checkpoint intact. Its cost is timed as the "checkpoint"
phase of the step that wrote it. The file holds only tensors and plain Python values, so it loads with
torch.load(weights_only=True).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from perflab.errors import PerflabError
from perflab.hooks import StepHook
from perflab.results import atomic_file

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 1


@dataclass
class NumpyRng:
    """numpy's global generator state (np.random.get_state), its key array as a tensor so the file loads with
    weights_only=True."""

    kind: str = "MT19937"
    keys: Optional[torch.Tensor] = None
    pos: int = 0
    has_gauss: int = 0
    cached_gaussian: float = 0.0


@dataclass
class RngState:
    """Every random generator a step can draw from: torch (CPU and each GPU), numpy and Python."""

    torch: Optional[torch.Tensor] = None
    cuda: list[torch.Tensor] = field(default_factory=list)
    numpy: NumpyRng = field(default_factory=NumpyRng)
    python: Optional[list[Any]] = None  # random.getstate() with its tuples as lists

    def to_dict(self) -> dict[str, Any]:
        return {"torch": self.torch, "cuda": self.cuda, "numpy": dict(vars(self.numpy)), "python": self.python}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RngState":
        known = _known(cls, data)
        known["numpy"] = NumpyRng(**_known(NumpyRng, known.get("numpy") or {}))
        return cls(**known)


@dataclass
class TrainingState:
    """What a checkpoint holds: the step it was saved after and the state dicts of the training objects. The file
    is TrainingState.to_dict() (plain values and tensors); keys an older file lacks take their defaults."""

    step: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: Optional[dict[str, Any]] = None
    scaler: Optional[dict[str, Any]] = None
    rng: Optional[RngState] = None
    format: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "step": self.step, "model": self.model, "optimizer": self.optimizer,
                "scaler": self.scaler, "rng": self.rng.to_dict() if self.rng is not None else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingState":
        known = _known(cls, data)
        known["rng"] = RngState.from_dict(known["rng"]) if known.get("rng") else None
        return cls(**known)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of the dataclass `cls` (older or newer files: the rest defaults)."""
    return {key: data[key] for key in cls.__dataclass_fields__ if key in data}


def rng_state() -> RngState:
    """Every random generator a step can draw from: torch (CPU and each GPU), numpy and Python."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return RngState(torch=torch.get_rng_state(),
                    cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    numpy=NumpyRng(kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
                    python=_to_lists(random.getstate()))


def set_rng_state(state: RngState) -> None:
    if state.torch is not None:
        torch.set_rng_state(state.torch)
    if state.cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state.cuda[:torch.cuda.device_count()])
    numpy = state.numpy
    if numpy.keys is not None:
        np.random.set_state((numpy.kind, numpy.keys.numpy().astype(np.uint32), numpy.pos, numpy.has_gauss,
                             numpy.cached_gaussian))
    if state.python is not None:
        version, internal, gauss = state.python
        random.setstate((version, tuple(internal), gauss))


def _to_lists(value: Any) -> Any:
    return [_to_lists(v) for v in value] if isinstance(value, tuple) else value


def save_checkpoint(path: Union[str, Path], plan, step: int) -> Path:
    """Write the training state of `plan` after `step` steps to `path`, atomically."""
    path = Path(path)
    state = TrainingState(step=step, model=plan.eager_model.state_dict(),
                          optimizer=plan.optimizer.state_dict() if plan.optimizer is not None else None,
                          scaler=plan.scaler.state_dict() if plan.scaler is not None else None, rng=rng_state())
    with atomic_file(path) as temp:
        torch.save(state.to_dict(), temp)
    return path


def resolve_checkpoint(path: Union[str, Path]) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise PerflabError(f"--resume-from {path}: no checkpoint there; give a checkpoint.pt or the run "
                           "directory of a run made with --checkpoint-every")
    return path


def load_checkpoint(path: Union[str, Path], plan) -> int:
    """Restore model, optimizer, scaler and RNG states into `plan`; returns the step it was saved at.

    Loaded on the CPU: load_state_dict copies into the plan's tensors wherever they live."""
    path = resolve_checkpoint(path)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: say which and what to do
        raise PerflabError(f"--resume-from {path}: cannot read it as a perflab checkpoint "
                           f"({type(err).__name__}); point at a checkpoint.pt written by perflab") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT_VERSION:
        raise PerflabError(f"--resume-from {path}: not a perflab checkpoint (format {FORMAT_VERSION} expected)")
    state = TrainingState.from_dict(saved)
    try:
        plan.eager_model.load_state_dict(state.model)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise PerflabError(f"--resume-from {path}: the model does not match this checkpoint ({first}); "
                           "use the same workload and options as the run that saved it") from None
    if plan.optimizer is not None and state.optimizer is not None:
        plan.optimizer.load_state_dict(state.optimizer)
    if plan.scaler is not None and state.scaler is not None:
        plan.scaler.load_state_dict(state.scaler)
    if state.rng is not None:
        set_rng_state(state.rng)
    return int(state.step)


class CheckpointHook(StepHook):
    """Saves a checkpoint every `every` timed steps (as the 'checkpoint' phase); resumes in start().

    The recorded step counts optimizer steps: the resumed step, the warm-up steps, then timed steps."""

    def __init__(self, directory: Union[str, Path], every: Optional[int] = None,
                 resume_from: Optional[str] = None, warmup: int = 0):
        self.path = Path(directory) / CHECKPOINT_FILE
        self.every = every
        self.resume_from = resume_from
        self.warmup = warmup
        self.start_step = 0
        self.saves = 0

    def start(self, plan) -> None:
        if plan.mode != "train":
            raise PerflabError("checkpoints apply to training runs; use --mode train")
        if self.resume_from:
            self.start_step = load_checkpoint(self.resume_from, plan)

    def after_step(self, plan, timer, step: int) -> None:
        if self.every and (step + 1) % self.every == 0:
            with timer.phase("checkpoint"):
                save_checkpoint(self.path, plan, self.start_step + self.warmup + step + 1)
            self.saves += 1

    def finish(self, result) -> None:
        if self.resume_from:
            result.notes.append(f"resumed from {self.resume_from} at step {self.start_step} (before warm-up; "
                                "warm-up steps train the model too)")
        if self.every:
            result.notes.append(f"checkpoint written {self.saves} times to {self.path} (every {self.every} "
                                "timed steps; its cost is the 'checkpoint' phase)")
        result.timing["checkpoint"] = {"path": str(self.path) if self.every else None, "every": self.every,
                                       "saves": self.saves, "resumed_from": self.resume_from,
                                       "resumed_at_step": self.start_step}


def checkpoint_hooks(cfg, directory: Union[str, Path]) -> list[StepHook]:
    """The hooks a config asks for: none unless --checkpoint-every or --resume-from is set."""
    if not (cfg.checkpoint_every or cfg.resume_from):
        return []
    return [CheckpointHook(directory, cfg.checkpoint_every, cfg.resume_from, cfg.warmup)]

"""The training gate's fp32 eager baseline, kept between the trials of one tune.

Every gated training trial of a tune trains the same fp32 eager baseline, and its twin with the weights nudged at
rounding level (the noise floor), from the same weights on the same batches: only the candidate differs. Where
CACHE_ENV names a folder (tune sets it for its trials, perflab/tune/trial.py), the gate stores the two loss
trajectories under a key made of what they depend on, and a later trial with the same key reads them instead of
training the baseline twice again:

- the run's settings with every lever's option taken out (the baseline runs no lever) and the settings that only
  time (trials, steps, warm-up, the output folder) left out; torch's version and the device's name (a --resume
  after an upgrade trains its own);
- a digest of the initial weights and buffers;
- a digest of the batches the candidate's steps received (the baseline's inputs).

A lever that changes what the baseline sees (a batch size, a data path that delivers other bytes) makes another key.
A digest is sums of the values and of the values weighted by position, in float64: it tells apart what a lever does
to the data, not what an adversary could forge.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from torch.utils._pytree import tree_leaves

from perflab.levers import all_levers

CACHE_ENV = "PERFLAB_GATE_BASELINE_CACHE"
# RunConfig fields that only say how a run is timed or where it writes: they do not change the baseline's losses
TIMING_FIELDS = ("out", "trials", "steps", "warmup", "min_trial_s", "check_quality", "quality_rtol",
                 "quality_loss_rtol", "profile", "max_p99_ms")
CHUNK = 1 << 24  # elements a digest reduces at a time (a float64 copy of 16 M elements: 128 MB)


def cache_folder() -> Optional[Path]:
    """The folder CACHE_ENV names, or None (no cache: every gate trains its baseline)."""
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else None


def tensor_digest(tensors: Iterable[Any]) -> str:
    """A short digest of tensors (and other leaves by their repr): shape, dtype, and float64 sums per tensor."""
    parts = []
    for leaf in tensors:
        if not isinstance(leaf, torch.Tensor):
            parts.append(repr(leaf))
            continue
        flat = leaf.detach().reshape(-1)
        total = weighted = 0.0
        for start in range(0, flat.numel(), CHUNK):
            chunk = flat[start:start + CHUNK].to(torch.float64)
            position = torch.arange(start, start + chunk.numel(), device=chunk.device, dtype=torch.float64)
            total += float(chunk.sum())
            weighted += float((chunk * (position % 1009 + 1)).sum())
        parts.append(f"{tuple(leaf.shape)}|{leaf.dtype}|{total!r}|{weighted!r}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def baseline_settings(cfg) -> dict[str, Any]:
    """The run's settings as the baseline sees them: no lever's option, no timing setting."""
    settings = cfg.to_dict()
    for name in {lever.option for lever in all_levers()} | set(TIMING_FIELDS):
        settings.pop(name, None)
    return settings


def baseline_key(cfg, model: torch.nn.Module, inputs: list[Any], levers: Iterable[Any] = ()) -> str:
    """The key of a baseline: its settings (with the options of the `levers` it does run: a distributed gate's
    baseline keeps --grad-accum), its initial weights and buffers, its input batches."""
    weights = tensor_digest(list(model.parameters()) + list(model.buffers()))
    settings = {**baseline_settings(cfg), **{lever.option: getattr(cfg, lever.option) for lever in levers}}
    device = next(iter(model.parameters()), torch.empty(0)).device
    where = [torch.__version__, torch.cuda.get_device_name(device) if device.type == "cuda" else device.type]
    text = json.dumps({"settings": settings, "weights": weights, "where": where,
                       "inputs": tensor_digest(tree_leaves(inputs))}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def load(key: str) -> Optional[tuple[list[float], Optional[list[float]]]]:
    """The stored (baseline, nudged) loss trajectories of `key`, or None (no cache, no entry, an unreadable one)."""
    folder = cache_folder()
    path = folder / f"{key}.json" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
        return [float(v) for v in stored["baseline"]], (None if stored.get("nudged") is None
                                                         else [float(v) for v in stored["nudged"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(key: str, baseline: list[float], nudged: Optional[list[float]]) -> None:
    """Keep the trajectories of `key` for the next trial (written whole, then renamed: a reader never sees half)."""
    folder = cache_folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{key}.json.tmp{os.getpid()}"
    temporary.write_text(json.dumps({"baseline": baseline, "nudged": nudged}))
    os.replace(temporary, folder / f"{key}.json")

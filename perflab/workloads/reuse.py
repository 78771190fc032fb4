"""Built workloads reused by a long-lived process (tune's warm worker, perflab/tune/worker.py).

A cold `perflab run` seeds, builds the workload and trains it. A warm worker runs many such runs in one process, so it
keeps the last workload it built, untouched, with the random-number state its build left, and hands every run whose
build inputs are the same a deep copy of it: the same initial weights and the same random draws after the build as a
fresh process would have. A build sees the whole config, so the key is what it could read: for a built-in workload
the fields perflab's builds read (BUILTIN_BUILD_INPUTS), for a user's the whole config but --out (a plugin may read a
lever: tests/fixtures/sleepy_plugin.py reads --compile). Only a workload built on the CPU is kept: a copy held on the
GPU would count in the next run's peak memory.
"""
from __future__ import annotations

import copy
import json
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np
import torch

from perflab.workloads import BUILTIN_MODULES, Workload, load_workload

# Every RunConfig field a built-in build(cfg) reads (and load_workload's contract check: mode, batch_size);
# tests/test_tune_worker.py checks this against the built-in modules' source.
BUILTIN_BUILD_INPUTS = ("workload", "device", "seed", "mode", "batch_size", "workload_options", "augment",
                        "activation_checkpointing", "quantize", "speculative", "draft")


def build_key(cfg) -> str:
    """What a build of cfg's workload could read, as one string: equal keys build equal workloads."""
    fields = cfg.to_dict()
    if cfg.workload in BUILTIN_MODULES:
        fields = {name: fields[name] for name in BUILTIN_BUILD_INPUTS}
    else:
        fields.pop("out", None)
    return json.dumps(fields, sort_keys=True, default=str)


@dataclass
class RandomState:
    """Every generator a build may draw from: Python's, NumPy's, torch's CPU and (when started) CUDA's."""

    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    torch_cuda: Optional[list[torch.Tensor]]

    @classmethod
    def now(cls) -> "RandomState":
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)


@dataclass
class Built:
    key: str
    workload: Workload  # never run: each run gets a deep copy
    random_state: RandomState  # as the build left it


def on_cpu(workload: Workload) -> bool:
    """Whether the model's parameters and buffers are all on the CPU (a copy of it costs no device memory)."""
    tensors = [*workload.model.parameters(), *workload.model.buffers()]
    return all(tensor.device.type == "cpu" for tensor in tensors)


class BuiltWorkloads:
    """The last workload built, by build key (one kept: a new key replaces it)."""

    def __init__(self) -> None:
        self.last: Optional[Built] = None
        self.builds = 0  # how many times a workload was built (tests and notes read it)

    def load(self, cfg) -> Workload:
        """cfg's workload, seeded as pipeline.load seeds it: a copy of the one built for the same key, else built."""
        key = build_key(cfg)
        if self.last is not None and self.last.key == key:
            self.last.random_state.restore()
            return copy.deepcopy(self.last.workload)
        self.last = None  # let the old one go before building the next
        workload = load_workload(cfg.workload, cfg)
        self.builds += 1
        self.last = self._keep(key, workload)
        return workload

    @staticmethod
    def _keep(key: str, workload: Workload) -> Optional[Built]:
        if not on_cpu(workload):
            return None
        state = RandomState.now()
        try:
            kept = copy.deepcopy(workload)
        except Exception:  # something in it cannot be copied (a file handle, a lock): build it every time
            return None
        return Built(key, kept, state)


REUSED_BUILDS: Optional[BuiltWorkloads] = None  # the cache, set only inside `reusing_builds` (the warm worker)


@contextmanager
def reusing_builds() -> Iterator[BuiltWorkloads]:
    """Inside, pipeline.load reuses built workloads (load_or_build); outside, every run builds its own."""
    global REUSED_BUILDS
    REUSED_BUILDS = BuiltWorkloads()
    try:
        yield REUSED_BUILDS
    finally:
        REUSED_BUILDS = None


def load_or_build(cfg) -> Workload:
    """cfg's workload: from the reused builds where a warm worker keeps them, else built."""
    if REUSED_BUILDS is None:
        return load_workload(cfg.workload, cfg)
    return REUSED_BUILDS.load(cfg)

"""StepPlan: the concrete step a run executes, after levers have transformed model, data path and step."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
from torch import nn

from perflab.step.data import DeviceBatches, first_batches, loader_batches, make_loader, to_device
from perflab.workloads.base import Workload


@dataclass
class StepPlan:
    """Everything the timed loop reads. Levers edit it before any step runs."""

    workload: Workload
    device: torch.device
    mode: str
    batch_size: int
    data_source: str  # "loader" or "device"
    model: nn.Module  # what the loop calls (possibly compiled)
    # the same weights, uncompiled (FLOP counting, quality checks); under DDP/FSDP a replica without storage, None
    # when the model cannot be copied
    eager_model: Optional[nn.Module]
    loss_fn: Optional[Callable] = None
    optimizer: Optional[torch.optim.Optimizer] = None
    autocast_dtype: Optional[torch.dtype] = None
    scaler: Any = None  # torch.amp.GradScaler for fp16 training
    memory_format: Optional[torch.memory_format] = None
    non_blocking: bool = True
    # loader settings (data-path levers edit these before the loader is made)
    workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = None
    # Wraps the host batch iterator; returns an iterator of batches already on the device (stream prefetcher).
    device_feeder: Optional[Callable[[Iterator], Iterator]] = None
    # Batched on-device transform (GPU augmentation), timed as the "augment" phase.
    gpu_transform: Optional[Callable[[Any], Any]] = None
    # Replaces forward/backward/optimizer with one call on a device batch (CUDA graphs, stream pipelining).
    step_fn: Optional[Callable[[Any], None]] = None
    # Replaces the whole step with one call that times its own phases: (plan, batch, timer, mark) -> None
    # (generation: the prefill and every decode step of a request batch).
    custom_step: Optional[Callable[..., None]] = None
    # Generation workloads: the settings the generation levers fill in (perflab.generation.plan).
    generation: Any = None
    # StepHooks the plan itself needs around the timed trials (generation's per-token metrics).
    hooks: list[Any] = field(default_factory=list)
    # Data parallelism (perflab/levers/distributed.py): this rank's share of the data, (rank, world size); the
    # settings of the DDP / fully_shard wrapper, gathered by the levers before the wrapping lever reads them;
    # and gradient accumulation (the optimizer steps, and DDP all-reduces, every `grad_accum` steps).
    data_shard: tuple[int, int] = (0, 1)
    parallel_options: dict[str, Any] = field(default_factory=dict)
    grad_accum: int = 1
    micro_step: int = 0  # training steps taken, for the accumulation cycle
    # A context that skips the data-parallel gradient all-reduce (DDP no_sync), set by the wrapping lever.
    skip_gradient_sync: Optional[Callable[[], ContextManager]] = None
    # Context managers worn around warm-up and trials (e.g. an SDPA backend choice).
    run_contexts: list[Callable[[], ContextManager]] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    markers: bool = True
    # The last step's loss (train) or output (infer), kept by reference so the runner can check once after a
    # trial that it stayed finite; a step_fn that bypasses the loop's model call exposes last_loss/last_output.
    last_value: Any = None

    def last_step_value(self) -> Any:
        """What the last step computed: its loss (train) or output (infer), wherever the step produced it."""
        name = "last_loss" if self.mode == "train" else "last_output"
        return getattr(self.step_fn, name, None) if self.step_fn is not None else self.last_value

    def autocast(self) -> ContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """What every run of steps wears: the levers' run contexts, and inference_mode when inferring."""
        with contextlib.ExitStack() as stack:
            for context in self.run_contexts:
                stack.enter_context(context())
            if self.mode == "infer":
                stack.enter_context(torch.inference_mode())
            yield

    def accumulating(self) -> bool:
        """Advance the accumulation cycle: True for the first grad_accum-1 steps of each cycle (no optimizer
        step, no gradient all-reduce), False on the last."""
        position = self.micro_step % self.grad_accum
        self.micro_step += 1
        return position < self.grad_accum - 1

    def gradient_sync(self, accumulating: bool) -> ContextManager:
        """What forward and backward wear: the wrapper's no_sync while accumulating, else nothing."""
        if accumulating and self.skip_gradient_sync is not None:
            return self.skip_gradient_sync()
        return contextlib.nullcontext()

    def to_device(self, batch: Any) -> Any:
        return to_device(batch, self.device, self.non_blocking and self.pin_memory, self.memory_format)

    def batches(self, seed: int) -> Iterator[Any]:
        """The endless stream of batches the loop consumes: on the host, or already on the device."""
        loader = make_loader(self.workload.dataset, self.batch_size, self.workers, self.pin_memory,
                             self.persistent_workers, self.prefetch_factor, self.workload.collate_fn, seed,
                             self.data_shard)
        if self.data_source == "device":
            return iter(DeviceBatches(first_batches(loader, DeviceBatches.STAGED), self.device,
                                      self.memory_format))
        if self.device_feeder is not None:
            return self.device_feeder(loader_batches(loader))
        return loader_batches(loader)

    @property
    def batches_on_device(self) -> bool:
        return self.data_source == "device" or self.device_feeder is not None

    def cleanup(self) -> None:
        for undo in reversed(self.cleanups):
            undo()
        self.cleanups.clear()

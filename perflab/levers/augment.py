"""--augment cpu|gpu|gpu-stream: where a workload's augmentations run (seed 004, part 2).

- cpu: the workload's per-sample pipeline in the dataset (DataLoader workers with --workers N). This is
  what a workload that declares augmentations does by default; the lever only makes it explicit.
- gpu: the dataset returns raw uint8 images and the workload's batched `gpu_augment` runs on the run's
  device, timed as the "augment" phase. On a CPU run it is the same batched transform on CPU tensors
  (one vectorised call per batch in the main process), which is what the CPU tests exercise.
- gpu-stream: as gpu, but the copy and augmentation of batch N+1 run on a side CUDA stream while batch
  N trains (a device feeder, like the stream prefetcher). CUDA only.

The workload's `build(cfg)` reads `cfg.augment` to choose its dataset; this lever checks the workload
declared support and wires the device side. None of these change the model's numerics (the quality
gate feeds baseline and candidate the same augmented batches), so none of them trigger the gate; the
random augmentations themselves differ between the CPU and device paths (different random streams).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from perflab.step.data import in_memory_format
from perflab.bottlenecks import CPU_AUGMENTATION, H2D_COPIES, INPUT_PIPELINE
from perflab.levers import DEVICE_WORK, ONE_TRIAL, Address, Lever, TuneHints, first_refusal
from perflab.levers.data_path import _needs_loader
from perflab.levers.prefetcher import StreamPrefetcher


def _needs_augment_support(cfg, workload, device) -> Optional[str]:
    if not workload.supports_augment:
        return (f"{workload.name} declares no augmentations (Workload.supports_augment is False); "
                "use a workload that does, e.g. --workload augment or driving")
    if cfg.augment in ("gpu", "gpu-stream") and workload.gpu_augment is None:
        return (f"{workload.name} has no batched gpu_augment; its build(cfg) must set Workload.gpu_augment "
                "when cfg.augment is gpu or gpu-stream")
    return None


def device_augment(plan) -> Callable[[Any], Any]:
    """The workload's batched augmentation, with its output in the plan's memory format."""
    augment = plan.workload.gpu_augment
    return lambda batch: in_memory_format(augment(batch), plan.memory_format)


class AugmentingPrefetcher(StreamPrefetcher):
    """Copies batch N+1 to the device and augments it on a side stream while batch N trains.

    StreamPrefetcher provides the stream semantics: the compute stream waits on the side stream before
    it takes a batch, and `record_stream` keeps the augmented tensors' memory from being reused by the
    side stream while compute still reads them. Intermediates (the uint8 copy) live and die on the side
    stream, so they need no record.
    """

    def __init__(self, host_batches: Iterator[Any], device: torch.device, augment: Callable[[Any], Any]):
        super().__init__(host_batches, device)
        self.augment = augment
        # Anything the augmentation reads that was made on the compute stream must be ready first.
        self.copy_stream.wait_stream(torch.cuda.current_stream(device))

    def _preload(self) -> None:
        super()._preload()
        with torch.cuda.stream(self.copy_stream):
            self.pending = self.augment(self.pending)


def _apply_cpu(plan, cfg) -> None:
    plan.notes.append("augment cpu: per-sample augmentations run in the dataset (add --workers N to parallelise)")


def _apply_gpu(plan, cfg) -> None:
    plan.gpu_transform = device_augment(plan)


def _apply_gpu_stream(plan, cfg) -> None:
    plan.pin_memory = True
    augment = device_augment(plan)
    plan.device_feeder = lambda host_batches: AugmentingPrefetcher(host_batches, plan.device, augment)
    plan.notes.append("augment gpu-stream: augmentation runs on a side stream, overlapped with the step; "
                      "it shows in no phase of its own")


LEVERS = [
    Lever("augment-cpu", "augment", "cpu", "per-sample augmentation on the CPU, in the dataset / DataLoader workers",
          "a workload that declares augmentations", (Address(INPUT_PIPELINE),), 16, _apply_cpu,
          in_code="augment per item in the Dataset's __getitem__, with DataLoader(..., num_workers=N) running it",
          when_lost="per-item augmentation on the CPU lost: the device path is cheaper here; augment on the GPU "
                    "in batches, or precompute the augmented data",
          tune=TuneHints(ONE_TRIAL), checks=_needs_augment_support),
    Lever("augment-gpu", "augment", "gpu",
          "batched, vectorised augmentation on the device (per-sample randomness); uint8 host batches",
          "a workload with a batched gpu_augment (on a CPU run: the same batched transform on the CPU)",
          (Address(INPUT_PIPELINE, 5, CPU_AUGMENTATION), Address(H2D_COPIES, 3)), 16, _apply_gpu,
          in_code="run the per-batch augmentation on the GPU after the copy, not per item in the Dataset",
          when_lost="GPU augmentation lost: precompute the augmented data, or lighten the transforms",
          tune=TuneHints(ONE_TRIAL, data_path=DEVICE_WORK), checks=_needs_augment_support),
    Lever("augment-gpu-stream", "augment", "gpu-stream",
          "batched device augmentation of the next batch on a side CUDA stream, overlapped with the step",
          "CUDA, a DataLoader data source, a workload with a batched gpu_augment",
          (Address(INPUT_PIPELINE, 6, CPU_AUGMENTATION), Address(H2D_COPIES)), 16, _apply_gpu_stream,
          in_code="run the per-batch augmentation on the GPU, on a side stream one batch ahead",
          when_lost="GPU augmentation on a side stream lost: run it on the default stream, or precompute it",
          tune=TuneHints(ONE_TRIAL),
          checks=first_refusal(_needs_augment_support, _needs_loader("--augment gpu-stream"))),
]

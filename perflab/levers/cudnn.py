"""--cudnn-benchmark: cuDNN times the candidate algorithms of each convolution shape once and keeps the fastest.

Off (PyTorch's default), cuDNN picks an algorithm by heuristics. On, the first call of each new input shape runs
every applicable algorithm (in warm-up, since the shapes repeat) and the choice is cached. It pays on fixed
shapes; with shapes that keep changing, each new one is timed again. The chosen algorithm may differ in the last
bits from the heuristic one, so the quality gate checks it.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from perflab.bottlenecks import COMPUTE_BOUND, CONVOLUTIONS, MEMORY_BANDWIDTH
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints

CONVOLUTION_MODULES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def set_cudnn_benchmark(enabled: bool) -> Callable[[], None]:
    """Switch cuDNN's algorithm timing; returns a function that restores the old state (it is process-wide)."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled

    def restore() -> None:
        torch.backends.cudnn.benchmark = before
    return restore


def _refuse_without_convs(cfg, workload, device) -> Optional[str]:
    if not any(isinstance(module, CONVOLUTION_MODULES) for module in workload.model.modules()):
        return f"{workload.name} has no convolutions, so there is no cuDNN algorithm to choose"
    return None


def _apply(plan, cfg) -> None:
    plan.cleanups.append(set_cudnn_benchmark(True))


LEVERS = [
    Lever("cudnn-benchmark", "cudnn_benchmark", True, "cuDNN times each convolution's algorithms once and keeps "
          "the fastest", "CUDA and a model with convolutions (fixed input shapes)",
          (Address(COMPUTE_BOUND, 5, CONVOLUTIONS), Address(MEMORY_BANDWIDTH, 3, CONVOLUTIONS)), 31, _apply,
          in_code="torch.backends.cudnn.benchmark = True before the first step (input shapes fixed)",
          when_lost="cuDNN's timed algorithms lost: its heuristic choice is already the fastest here, or the "
                    "input shapes change between steps",
          tune=TuneHints(ONE_TRIAL), checks=_refuse_without_convs),
]

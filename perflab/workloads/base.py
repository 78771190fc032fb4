"""The Workload contract: what a built-in or user `build(cfg)` returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
BatchTransform = Callable[[Any], Any]


@dataclass
class Workload:
    """A model, a dataset of `(input, target)` items, and a loss: everything perflab needs to measure.

    `input` may be a tensor, a tuple of tensors or a dict of tensors. The optional fields declare what
    a workload supports, so levers that need them can be refused with a reason when they are absent.
    """

    name: str
    model: nn.Module
    dataset: Dataset
    loss_fn: Optional[LossFn] = None
    optimizer_factory: Optional[OptimizerFactory] = None
    description: str = ""
    collate_fn: Optional[Callable] = None
    # Batched, on-device augmentation applied to `(input, target)` when built with --augment gpu*.
    gpu_augment: Optional[BatchTransform] = None
    # Frozen front stage and trainable rest (model == trainable_stage(frozen_stage(x))), for --pipeline streams.
    frozen_stage: Optional[nn.Module] = None
    trainable_stage: Optional[nn.Module] = None
    supports_activation_checkpointing: bool = False
    supports_augment: bool = False
    uses_attention: bool = False
    is_classifier: bool = False
    supports_inference: bool = True  # False for a training-only workload (perflab serve refuses it)
    default_data: str = "loader"  # "loader" or "device" (pre-staged synthetic batches)
    info: dict[str, Any] = field(default_factory=dict)
    # A dataset smaller than one batch is refused unless this is True: then its items repeat within batches.
    repeat_items: bool = False

    def make_optimizer(self) -> torch.optim.Optimizer:
        """The workload's optimizer, or SGD with momentum over trainable parameters."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.optimizer_factory is not None:
            return self.optimizer_factory(params)
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)

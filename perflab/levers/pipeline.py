"""--pipeline streams: the frozen front stage runs on batch N+1 on its own CUDA stream while the trainable
stage trains on batch N on the compute stream (seed 004, part 1).

Because the frozen stage takes no gradients, its output for the next batch does not depend on this
step's update, so the losses are exactly those of the serial run; only the schedule changes. The
pipeline is a device feeder: it copies each host batch and runs the frozen stage (under no_grad) on a
side stream one batch ahead; the loop still sees (inputs, target) batches, and the plan's model takes
the precomputed features for those inputs and runs only the trainable stage on them.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import nn

from perflab.step.calls import call_model, inputs_from_call
from perflab.step.data import map_tensors, to_device
from perflab.bottlenecks import COMPUTE_BOUND, LAUNCH_OVERHEAD
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints, first_refusal
from perflab.levers.data_path import _needs_loader


class FeatureHandoff:
    """The batch the pipeline handed out last, and the frozen-stage features computed for it."""

    def __init__(self):
        self.inputs: Any = None
        self.features: Any = None

    def take(self, inputs: Any) -> Any:
        """The precomputed features when `inputs` holds that batch's input tensors (the same objects), else None."""
        if self.inputs is None or (inputs is not self.inputs and not _same_tensors(inputs, self.inputs)):
            return None
        features, self.inputs, self.features = self.features, None, None
        return features


def _same_tensors(a: Any, b: Any) -> bool:
    """True when two input structures hold the very same tensor objects, in order."""
    left, right = [], []
    map_tensors(a, lambda tensor: left.append(tensor) or tensor)
    map_tensors(b, lambda tensor: right.append(tensor) or tensor)
    return len(left) == len(right) and all(x is y for x, y in zip(left, right))


class FrozenStagePipeline:
    """Iterates device batches; the frozen stage of batch N+1 runs on a side stream while batch N trains.

    Stream semantics: the side stream first waits for the compute stream (the weights were placed there);
    before a batch is handed out the compute stream waits for the side stream, and `record_stream` marks
    its inputs, targets and features as used by the compute stream, so the caching allocator does not give
    their memory back to the side stream while the trainable stage still reads them.
    """

    def __init__(self, host_batches: Iterator[Any], plan, frozen_stage: nn.Module, handoff: FeatureHandoff):
        self.host_batches = host_batches
        self.plan = plan
        self.frozen_stage = frozen_stage
        self.handoff = handoff
        self.stream = torch.cuda.Stream(plan.device)
        self.stream.wait_stream(torch.cuda.current_stream(plan.device))
        self.pending: Any = None

    def _preload(self) -> None:
        host_batch = next(self.host_batches)
        plan = self.plan
        with torch.cuda.stream(self.stream):
            inputs, target = to_device(host_batch, plan.device, non_blocking=True, memory_format=plan.memory_format)
            with torch.no_grad(), plan.autocast():
                features = call_model(self.frozen_stage, inputs)
        self.pending = (inputs, target, features)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.pending is None:
            self._preload()
        compute_stream = torch.cuda.current_stream(self.plan.device)
        compute_stream.wait_stream(self.stream)
        inputs, target, features = self.pending
        map_tensors(self.pending, lambda tensor: tensor.record_stream(compute_stream) or tensor)
        self.handoff.inputs, self.handoff.features = inputs, features
        self._preload()  # the frozen stage of the next batch, queued before this batch trains
        return inputs, target


class PipelinedModel(nn.Module):
    """trainable(frozen(x)), taking frozen(x) from the pipeline when it already computed it for this x.

    Any other input (FLOP counting, the quality gate's cloned batches) goes through `full_model`, so
    the model means the same thing with and without the pipeline.
    """

    def __init__(self, full_model: nn.Module, trainable_stage: nn.Module, handoff: FeatureHandoff):
        super().__init__()
        self.full_model = full_model
        self.trainable_stage = trainable_stage
        self.handoff = handoff

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        features = self.handoff.take(inputs_from_call(args, kwargs))
        if features is None:
            return self.full_model(*args, **kwargs)
        return self.trainable_stage(features)  # the contract: model(x) == trainable_stage(frozen_stage(x))


def _needs_stages(cfg, workload, device) -> Optional[str]:
    if workload.frozen_stage is None or workload.trainable_stage is None:
        return (f"{workload.name} declares no frozen front stage (Workload.frozen_stage/trainable_stage); "
                "use a workload that does, e.g. --workload segmentation")
    return None


def _apply(plan, cfg) -> None:
    workload = plan.workload
    frozen, trainable = workload.frozen_stage, workload.trainable_stage
    frozen.eval()
    if cfg.compile:  # the compile lever (applied before this one) compiled the full model
        trainable = torch.compile(trainable, mode=cfg.compile)
    handoff = FeatureHandoff()
    plan.model = PipelinedModel(plan.model, trainable, handoff)
    plan.pin_memory = True
    plan.device_feeder = lambda host_batches: FrozenStagePipeline(host_batches, plan, frozen, handoff)
    plan.notes.append("pipeline streams: the frozen stage runs one batch ahead on a side stream, so it shows in "
                      "no phase; forward/backward/optimizer cover the trainable stage")


LEVERS = [
    Lever("pipeline-streams", "pipeline", "streams",
          "run the frozen front stage of batch N+1 on its own CUDA stream while batch N trains",
          "CUDA, --mode train, a workload with frozen_stage/trainable_stage, a DataLoader data source",
          (Address(LAUNCH_OVERHEAD), Address(COMPUTE_BOUND)), 65, _apply,
          in_code="run the frozen front of the model one batch ahead on its own CUDA stream",
          when_lost="overlapping the frozen stage lost: the device was already busy during it; make the frozen "
                    "stage cheaper (lower precision, torch.compile) or cache its features",
          tune=TuneHints(ONE_TRIAL),
          checks=first_refusal(_needs_stages, _needs_loader("--pipeline streams"))),
]

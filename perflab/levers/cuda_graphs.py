"""--cuda-graphs: capture the whole static-shape step once and replay it (no per-kernel launch cost)."""
from __future__ import annotations

import itertools
from typing import Any, Optional

import torch

from perflab.step.calls import call_loss, call_model
from perflab.step.data import map_tensors
from perflab.step.graph_capture import capture_graph
from perflab.bottlenecks import INFERENCE_QUEUE, LAUNCH_OVERHEAD, NO_HOST_SYNCS
from perflab.levers import ONE_TRIAL, Address, Lever, TuneHints


def copy_into(static: Any, batch: Any) -> None:
    """Copy every tensor of `batch` into the same-shaped tensor of `static`."""
    if isinstance(static, torch.Tensor):
        static.copy_(batch, non_blocking=True)
    elif isinstance(static, dict):
        for key in static:
            copy_into(static[key], batch[key])
    elif isinstance(static, (tuple, list)):
        for s, b in zip(static, batch):
            copy_into(s, b)


class GraphedStep:
    """Captures the step on first use, then each call copies the batch into static inputs and replays."""

    def __init__(self, plan):
        self.plan = plan
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static_batch: Any = None
        # The graph's static loss and output: every replay rewrites them (the runner checks they stay finite).
        self.last_loss: Optional[torch.Tensor] = None
        self.last_output: Any = None

    def _eager_step(self, batch: Any) -> None:
        plan = self.plan
        inputs, target = batch
        with plan.autocast():
            output = call_model(plan.model, inputs)
            if plan.mode == "train":
                loss = call_loss(plan.loss_fn, output, target)
        self.last_output = output
        if plan.mode == "train":
            self.last_loss = loss
            loss.backward()
            plan.optimizer.step()
            plan.optimizer.zero_grad(set_to_none=True)

    def _capture(self, batch: Any) -> None:
        self.static_batch = map_tensors(batch, lambda tensor: tensor.clone())
        saved = _training_state(self.plan) if self.plan.mode == "train" else None
        self.graph, _ = capture_graph(lambda: self._eager_step(self.static_batch))
        if saved is not None:
            _restore_training_state(self.plan, saved)

    def __call__(self, batch: Any) -> None:
        if self.graph is None:
            self._capture(batch)
        copy_into(self.static_batch, batch)
        self.graph.replay()


def _training_state(plan) -> tuple[list[torch.Tensor], dict]:
    """Clones of the weights, buffers and optimizer state, taken before the warm-up iterations train."""
    model = plan.eager_model
    tensors = [tensor.detach().clone() for tensor in itertools.chain(model.parameters(), model.buffers())]
    optimizer_state = {param: {key: value.clone() for key, value in state.items() if torch.is_tensor(value)}
                       for param, state in plan.optimizer.state.items()}
    return tensors, optimizer_state


def _restore_training_state(plan, saved: tuple[list[torch.Tensor], dict]) -> None:
    """Undo the warm-up iterations in place (the graph keeps its addresses), so a graphed run trains the same
    steps as eager. Optimizer state the warm-up created is zeroed: a fresh state for SGD without dampening,
    Adam and AdamW (their first step from zeros equals their first step from nothing)."""
    tensors, optimizer_state = saved
    model = plan.eager_model
    with torch.no_grad():
        for live, old in zip(itertools.chain(model.parameters(), model.buffers()), tensors):
            live.copy_(old)
        for param, state in plan.optimizer.state.items():
            for key, value in state.items():
                if not torch.is_tensor(value):
                    continue
                old = optimizer_state.get(param, {}).get(key)
                if old is None:
                    value.zero_()
                else:
                    value.copy_(old)


def _refuse(cfg, workload, device) -> Optional[str]:
    if workload.generation is not None:
        return "generation captures its decode step with --compile reduce-overhead --kv-cache static"
    if cfg.mode == "train" and cfg.precision == "fp16":
        return "fp16 training's gradient scaler synchronises with the host; use --precision bf16 with graphs"
    return None


def _apply(plan, cfg) -> None:
    if plan.optimizer is not None:
        for group in plan.optimizer.param_groups:
            if "capturable" in group:
                group["capturable"] = True  # optimizer state must live on the device to be captured
    plan.step_fn = GraphedStep(plan)
    plan.notes.append("CUDA graphs: phases inside the step are not separable; see the 'step' phase")


LEVERS = [
    # A CUDA graph cannot capture a step that waits for the device: the launch rule names it only without syncs.
    Lever("cuda-graphs", "cuda_graphs", True, "capture the step as a CUDA graph and replay it",
          "CUDA, static shapes, no host syncs in the step",
          (Address(LAUNCH_OVERHEAD, 1, NO_HOST_SYNCS), Address(INFERENCE_QUEUE, 2)), 70, _apply,
          in_code="model = torch.compile(model, mode='reduce-overhead')",
          when_lost="CUDA graphs lost: a larger batch amortises the per-op cost; fuse the small ops (torch.compile "
                    "default mode) or write them as fewer, larger tensor ops",
          tune=TuneHints(ONE_TRIAL, screen_always=1), checks=_refuse),
]

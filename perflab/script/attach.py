"""perflab attached to a running script: global torch hooks and a few patched methods, all removed on exit.

While attached, and with nothing changed in the script:
- optimizer steps (torch's global optimizer step hooks) are timed as "optimizer" and end a training step;
- the model is the first outermost module with parameters (found by global module forward hooks that track
  the call depth during its first call, then replaced by hooks on the model alone); its calls are timed as
  "forward", and end inference steps;
- `Tensor.backward` is timed as "backward";
- `DataLoader` iterators' `__next__` is timed as the data wait ("data_wait", marker "data");
- `.to()` / `.cuda()` that move a loader's tensors (or, once steps run, any CPU tensor) to a device are
  timed as "h2d";
- the end of a `perflab.mark("step")` range in the script ends a step.
Every phase wears the same markers as `perflab run` (NVTX + record_function named data, h2d, forward,
backward, optimizer), so `diagnose` reads a script's trace like any other.

What it costs the script is kept to a few Python calls per step, not per op (a launch-bound script pays for
every one): after the model's first call no hook runs inside it (submodules take nn.Module's fast path again),
and `.to()` / `.cuda()` go back to torch's own once COPY_WATCH_STEPS steps have passed with no DataLoader batch
and no copy to time.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer
from torch.utils.data import dataloader as torch_dataloader

from perflab.step.calls import floating_tensors
from perflab.profile.markers import listen_for_step_ends, mark
from perflab.script.steps import StepDetector
from perflab.script.timeline import StepTimeline

COPY_WATCH_STEPS = 3  # steps without a loader batch or a host-to-device copy, after which .to() is torch's again


class Patches:
    """Replace attributes of classes and put the originals back, whether the class defined them or inherited them."""

    def __init__(self):
        self._saved: list[tuple[Any, str, bool, Any]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, name in vars(owner), vars(owner).get(name)))
        setattr(owner, name, make(original))

    @property
    def active(self) -> bool:
        return bool(self._saved)

    def restore(self) -> None:
        for owner, name, had_own, own in reversed(self._saved):
            if had_own:
                setattr(owner, name, own)
            else:
                delattr(owner, name)
        self._saved.clear()


class OpenPhase:
    """A phase entered in one hook and left in another (a forward pre-hook and its forward hook)."""

    __slots__ = ("timed", "marker")

    def __init__(self, timeline: StepTimeline, name: str):
        self.timed = timeline.phase(name)
        self.marker = mark(name)
        self.timed.__enter__()
        self.marker.__enter__()

    def close(self) -> None:
        self.marker.__exit__(None, None, None)
        self.timed.__exit__(None, None, None)


def tensors_in(batch: Any, found: Optional[list] = None) -> list[torch.Tensor]:
    """The tensors of a batch: a tensor, or tuples, lists and mappings of them (nested), without copying."""
    found = [] if found is None else found
    if isinstance(batch, torch.Tensor):
        found.append(batch)
    elif isinstance(batch, (tuple, list)):
        for item in batch:
            tensors_in(item, found)
    elif hasattr(batch, "items") and hasattr(batch, "keys"):  # dicts, and transformers' BatchEncoding
        for item in batch.values():
            tensors_in(item, found)
    return found


def _moves_off_cpu(args: tuple, kwargs: dict) -> bool:
    """Whether `.to(*args, **kwargs)` names a device other than the CPU."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        return target.device.type != "cpu"
    if isinstance(target, (str, torch.device, int)) and not isinstance(target, bool):
        try:
            return torch.device(target).type != "cpu"
        except (RuntimeError, ValueError):
            return False
    return False


class ScriptProbe:
    """Context manager: attaches the hooks and patches while the script runs; what it saw is on its fields."""

    def __init__(self, detector: StepDetector, timeline: StepTimeline):
        self.detector = detector
        self.timeline = timeline
        self.patches = Patches()
        self.copy_patches = Patches()  # .to() and .cuda(): put back early when the script makes no copies
        self.handles: list = []
        self.global_handles: list = []
        self.depth = 0  # of module calls, while the global hooks look for the model
        self.model_depth = 0
        self.model: Optional[torch.nn.Module] = None
        self.forward_phase: Optional[OpenPhase] = None
        self.optimizer_phase: Optional[OpenPhase] = None
        self.loader_tensors: set[int] = set()  # ids of the tensors of the latest batch
        self.batch_size: Optional[int] = None
        self.workers: Optional[int] = None
        self.optimizer_steps = 0
        self.batches = 0
        self.copies = 0  # host-to-device copies timed
        # what the last step computed, read once after the script (never inside a step: no sync there)
        self.last_loss: Optional[torch.Tensor] = None  # the tensor the last .backward() was called on
        self.last_output: Any = None  # the outermost model's last output, detached
        self.previous_step_listener = None

    def __enter__(self) -> "ScriptProbe":
        self.handles = [
            torch_optimizer.register_optimizer_step_pre_hook(self._optimizer_starts),
            torch_optimizer.register_optimizer_step_post_hook(self._optimizer_ends),
        ]
        # Without with_kwargs: torch (2.4 to 2.11 at least) leaves a global with_kwargs entry behind on removal,
        # and then warns at every call of a torch.compile'd model that global hooks exist.
        self.global_handles = [
            torch_module.register_module_forward_pre_hook(self._any_call_starts),
            torch_module.register_module_forward_hook(self._any_call_ends, always_call=True),
        ]
        self.patches.replace(torch_dataloader._BaseDataLoaderIter, "__next__", self._timed_next)
        self.patches.replace(torch.Tensor, "backward", self._timed_backward)
        self.copy_patches.replace(torch.Tensor, "to", self._timed_copy)
        self.copy_patches.replace(torch.Tensor, "cuda", self._timed_cuda)
        self.previous_step_listener = listen_for_step_ends(self._step_mark_closed)
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles + self.global_handles:
            handle.remove()
        self.handles, self.global_handles = [], []
        self.copy_patches.restore()
        self.patches.restore()
        listen_for_step_ends(self.previous_step_listener)
        for phase in (self.forward_phase, self.optimizer_phase):  # left open by an exception or Ctrl-C
            if phase is not None:
                phase.close()
        self.forward_phase = self.optimizer_phase = None

    # hooks -----------------------------------------------------------------------------------------
    def _optimizer_starts(self, optimizer, args, kwargs) -> None:
        if self.optimizer_phase is None:
            self.optimizer_phase = OpenPhase(self.timeline, "optimizer")

    def _optimizer_ends(self, optimizer, args, kwargs) -> None:
        if self.optimizer_phase is not None:
            self.optimizer_phase.close()
            self.optimizer_phase = None
        self.optimizer_steps += 1
        self.detector.optimizer_stepped(optimizer)
        self._stop_watching_copies_if_none()

    def _any_call_starts(self, module: torch.nn.Module, args) -> None:
        # Global hooks run on every module call (and take nn.Module's slow path), so they only look for the
        # model: the first outermost module with parameters. Its own hooks take over from there.
        if _compiling():  # inside torch.compile's tracing the hook folds away instead of breaking the graph
            return
        self.depth += 1
        if self.depth == 1 and self.model is None and next(module.parameters(), None) is not None:
            self._model_call_starts(module, args)

    def _any_call_ends(self, module: torch.nn.Module, args, output) -> None:
        if _compiling():
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.model is None and self.model_depth:
            self._model_call_ends(module, args, {}, output)  # keyword inputs are read from the next call
            self._adopt(module)

    def _adopt(self, model: torch.nn.Module) -> None:
        """The model is found: hooks on it alone replace the global ones, which then cost nothing."""
        for handle in self.global_handles:
            handle.remove()  # safe inside a hook: nn.Module iterates over a copy of the hooks
        self.global_handles = []
        self.model = model
        self.handles += [model.register_forward_pre_hook(self._model_call_starts),
                         model.register_forward_hook(self._model_call_ends, with_kwargs=True, always_call=True)]

    def _stop_watching_copies_if_none(self) -> None:
        """Put torch's own .to() and .cuda() back once steps show the script has nothing for them to time."""
        if (self.copy_patches.active and self.timeline.boundaries >= COPY_WATCH_STEPS and not self.batches
                and not self.copies):
            self.copy_patches.restore()

    def _model_call_starts(self, module: torch.nn.Module, args) -> None:
        if _compiling():
            return
        self.model_depth += 1
        if self.model_depth == 1:
            self.detector.model_call_started()
            self._stop_watching_copies_if_none()
            self.forward_phase = OpenPhase(self.timeline, "forward")

    def _model_call_ends(self, module: torch.nn.Module, args, kwargs, output) -> None:
        if _compiling():
            return
        if self.model_depth == 1:
            self.last_output = _detached(output)
        if self.model_depth == 1 and self.forward_phase is not None:
            self.forward_phase.close()
            self.forward_phase = None
            if self.batch_size is None:
                self.batch_size = _leading_dim((args, kwargs))  # model(x) or model(**batch)
        self.model_depth = max(0, self.model_depth - 1)

    # patched methods -------------------------------------------------------------------------------
    def _timed_next(self, original: Callable) -> Callable:
        probe = self

        def __next__(iterator):
            with probe.timeline.host_phase("data_wait"), mark("data"):
                batch = original(iterator)
            probe._saw_batch(iterator, batch)
            return batch
        return __next__

    def _saw_batch(self, iterator, batch: Any) -> None:
        tensors = tensors_in(batch)
        self.loader_tensors = {id(t) for t in tensors}
        self.batches += 1
        if self.workers is None:
            self.workers = getattr(iterator, "_num_workers", None)
        if self.batch_size is None and tensors and tensors[0].dim() > 0:
            self.batch_size = int(tensors[0].shape[0])

    def _is_h2d(self, tensor: torch.Tensor) -> bool:
        # A loader's tensors always; other tensors only once steps run (so model.to(device) is not a copy phase).
        return self.timeline.timer is not None or id(tensor) in self.loader_tensors

    def _timed_copy(self, original: Callable) -> Callable:
        probe = self

        def to(tensor, *args, **kwargs):
            # Cheapest tests first, in this one frame: most .to() calls in a GPU script are on device tensors,
            # and most of a CPU script's are dtype casts (`.to(torch.float32)`), which name no device.
            if (tensor.is_cpu and not (args and isinstance(args[0], torch.dtype)) and probe._is_h2d(tensor)
                    and _moves_off_cpu(args, kwargs) and not _compiling()):
                probe.copies += 1
                with probe.timeline.phase("h2d"), mark("h2d"):
                    return original(tensor, *args, **kwargs)
            return original(tensor, *args, **kwargs)
        return to

    def _timed_cuda(self, original: Callable) -> Callable:
        probe = self

        def cuda(tensor, *args, **kwargs):
            if tensor.is_cpu and probe._is_h2d(tensor) and not _compiling():
                probe.copies += 1
                with probe.timeline.phase("h2d"), mark("h2d"):
                    return original(tensor, *args, **kwargs)
            return original(tensor, *args, **kwargs)
        return cuda

    def _timed_backward(self, original: Callable) -> Callable:
        probe = self

        def backward(tensor, *args, **kwargs):
            probe.last_loss = tensor.detach()
            with probe.timeline.phase("backward"), mark("backward"):
                return original(tensor, *args, **kwargs)
        return backward

    def non_finite_reason(self) -> Optional[str]:
        """Why the script's last step is unusable: its loss (or, without a backward, its model outputs) holds
        NaN/inf. Read once, after the script has ended."""
        what, value = ("loss", self.last_loss) if self.last_loss is not None else ("model outputs", self.last_output)
        bad = sum(int((~torch.isfinite(tensor)).sum()) for tensor in floating_tensors(value)) if value is not None \
            else 0
        if not bad:
            return None
        return (f"the script's last {what} hold {bad} NaN/inf value(s): timings of a diverged model are not "
                "meaningful (check the learning rate, the loss and the inputs; fp16 overflows at 65504)")

    def _step_mark_closed(self) -> None:
        self.detector.step_mark_closed()
        self._stop_watching_copies_if_none()


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _leading_dim(call: Any) -> Optional[int]:
    """Dimension 0 of the first tensor in a module call's arguments (its batch size, usually)."""
    tensors = tensors_in(call)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else None


def _detached(output: Any) -> Any:
    """The floating tensors of a model's output, detached (so the autograd graph is not kept alive by perflab)."""
    return [tensor.detach() for tensor in floating_tensors(output)]

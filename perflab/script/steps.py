"""Where a script's steps end, found without help from the script.

Three sources, strongest first: the user's own `perflab.mark("step")` (the end of each range), an optimizer
step (torch's global optimizer step hooks), and the start of each call of the outermost model. A stronger
source replaces a weaker one the first time it is seen (a training script calls its model before its first
optimizer step), and from then on the weaker one is ignored (an evaluation pass between epochs does not end a
training step).
"""
from __future__ import annotations

from typing import Callable, Optional

FORWARD = "forward"
OPTIMIZER = "optimizer"
MARK = "mark"
STRENGTH = {FORWARD: 1, OPTIMIZER: 2, MARK: 3}
DESCRIPTION = {
    FORWARD: "each call of the outermost model (no optimizer step was seen)",
    OPTIMIZER: "each optimizer step (torch's global optimizer step hooks)",
    MARK: "each `perflab.mark(\"step\")` range in the script",
}


class StepDetector:
    """Turns hook events into step boundaries; calls `on_boundary(switched)` at each one.

    `switched` is True at the first boundary of a stronger source: steps the weaker one counted do not count.
    """

    def __init__(self, on_boundary: Callable[[bool], None]):
        self.on_boundary = on_boundary
        self.source: Optional[str] = None
        self.replaced: list[str] = []  # weaker sources whose boundaries were dropped when a stronger one appeared
        self.boundaries = 0  # of the current source
        self.leading_optimizer: Optional[int] = None  # with several optimizers, one step of the first ends a step

    def _event(self, source: str, ends_step: bool = True) -> None:
        if self.source is not None and STRENGTH[source] < STRENGTH[self.source]:
            return
        switched = self.source is not None and source != self.source
        if switched:
            if self.boundaries:
                self.replaced.append(self.source)
            self.boundaries = 0
        self.source = source
        if ends_step:
            self.boundaries += 1
            self.on_boundary(switched)

    def model_call_started(self) -> None:
        """The outermost model's forward begins: it ends the previous step of an inference script."""
        if self.source is None:
            self._event(FORWARD, ends_step=False)  # the first call begins step 1
        elif self.source == FORWARD:
            self._event(FORWARD)

    def optimizer_stepped(self, optimizer) -> None:
        """An optimizer finished its step."""
        if self.leading_optimizer is None:
            self.leading_optimizer = id(optimizer)
        if id(optimizer) == self.leading_optimizer:
            self._event(OPTIMIZER)

    def step_mark_closed(self) -> None:
        """A `perflab.mark("step")` range in the script ended."""
        self._event(MARK)

    def describe(self) -> str:
        """How this run's steps were found, for result.json and the terminal."""
        if self.source is None:
            return "no steps were found (no optimizer step, no repeated model call, no perflab.mark(\"step\"))"
        text = DESCRIPTION[self.source]
        if self.replaced:
            text += f"; before the first one, {' then '.join(self.replaced)} boundaries were counted and dropped"
        return text

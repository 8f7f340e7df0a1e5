"""Megatron-LM's ``--manual-gc``: Python's garbage collector runs at fixed points of training
only, so that a collection never stalls one rank while the others wait in a collective."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from megatron_gamma.training.callback import Callback, StepOutput

if TYPE_CHECKING:
    from megatron_gamma.training.loop import Trainer


class ManualGCCallback(Callback):
    """Disables automatic collection at the start of training (after one collection) and
    collects every ``interval`` iterations (0: never during training) and, with
    ``after_eval``, after each evaluation; re-enables automatic collection at the end (as
    Megatron-LM's ``training.py`` does with ``--manual-gc``, ``--manual-gc-interval`` and
    ``--manual-gc-eval``).

    Args:
        interval: iterations between collections; 0 for none during training.
        after_eval: also collect after every validation pass.
    """

    def __init__(self, interval: int, after_eval: bool):
        self.interval = interval
        self.after_eval = after_eval

    def on_train_start(self, trainer: Trainer) -> None:
        gc.disable()
        gc.collect()

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        if self.interval and step.iteration % self.interval == 0:
            gc.collect()

    def on_eval(self, trainer: Trainer, iteration: int, loss: float) -> None:
        if self.after_eval:
            gc.collect()

    def on_train_end(self, trainer: Trainer) -> None:
        gc.enable()

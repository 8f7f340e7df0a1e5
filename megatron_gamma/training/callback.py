"""The training loop's callback interface: named hooks with a written contract (after OLMo-core).

:meth:`Trainer.train() <megatron_gamma.training.loop.Trainer.train>` is the loop plus hook calls;
everything that happens on a cadence (metrics, evaluation, checkpointing, diagnostics,
preemption) is a :class:`Callback` that owns its interval. Hooks, in the order the trainer calls
them:

==================  ==================================================================  =====
hook                when                                                                ranks
==================  ==================================================================  =====
``on_train_start``  once, before the first iteration of :meth:`train`; ``trainer.log``  all
                    is open
``on_step_end``     after every optimizer step; ``trainer.state.iteration`` already     all
                    counts it
``on_eval``         from the evaluation callback, after a validation pass               all
``on_save``         from the checkpoint or preemption callback, after a checkpoint      all
                    was written
``on_train_end``    once, after the last iteration (also after a preemption stop),      all
                    before the trainer closes ``trainer.log``
==================  ==================================================================  =====

Every hook runs on every rank (the work inside may be collective), and callbacks are called in
list order; :func:`megatron_gamma.training.loop.pretrain` composes the run's list and writes down
why it has that order. A callback stops the run with ``trainer.request_stop()``; the loop ends
after the current ``on_step_end`` round. The trainer owns its
:class:`~megatron_gamma.training.metrics.MetricsLogger` (``trainer.log``, rank 0 writes), so any
callback may log from any hook.

This module imports nothing of megatron-gamma at run time (the trainer is typed under
``TYPE_CHECKING`` only): the diagnostics and telemetry callbacks depend on it, never on the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from megatron_gamma.training.loop import Trainer


@dataclass(frozen=True)
class StepOutput:
    """What one optimizer step produced (identical on every rank).

    Attributes:
        iteration: the iteration just completed (from 1).
        loss: mean LM loss of the step over micro-batches and data-parallel ranks.
        grad_norm: global gradient norm before clipping.
        lr: learning rate the step used.
        seconds: wall-clock seconds of the step.
    """

    iteration: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float


class Callback:
    """Base class: every hook is a no-op; override the ones you need (contract above)."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first iteration of :meth:`Trainer.train`."""

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        """After every optimizer step."""

    def on_eval(self, trainer: Trainer, iteration: int, loss: float) -> None:
        """After a validation pass (mean validation loss)."""

    def on_save(self, trainer: Trainer, iteration: int, path: str) -> None:
        """After a checkpoint of ``iteration`` was written to ``path``."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last iteration (``trainer.result`` is final)."""


def due(iteration: int, interval: Optional[int], end: int) -> bool:
    """True at every ``interval``-th iteration (none when ``interval`` is 0 or None) and at the
    last one, ``end``: the cadence of the run's interval flags (``--log-interval``,
    ``--eval-interval``, ``--save-interval``)."""
    return bool(interval and iteration % interval == 0) or iteration == end

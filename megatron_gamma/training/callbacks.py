"""The training loop's callbacks: named hooks with a written contract (after OLMo-core).

:meth:`Trainer.train() <megatron_gamma.training.loop.Trainer.train>` is the loop plus hook calls;
everything that happens on a cadence (metrics, evaluation, checkpointing, diagnostics,
preemption) is a :class:`Callback` that owns its interval. Hooks, in the order the trainer calls
them:

==================  ================================================================  ==========
hook                when                                                              ranks
==================  ================================================================  ==========
``on_train_start``  once, before the first iteration of :meth:`train`                 all
``on_step_end``     after every optimizer step; ``trainer.state.iteration`` already   all
                    counts it
``on_eval``         from :class:`EvaluationCallback`, after a validation pass         all
``on_save``         from :class:`CheckpointCallback` / :class:`PreemptionCallback`,   all
                    after a checkpoint was written
``on_train_end``    once, after the last iteration (also after a preemption stop)     all
==================  ================================================================  ==========

Every hook runs on every rank (the work inside may be collective), and callbacks are called in
list order. :func:`default_callbacks` fixes the order the run relies on: metrics, then
evaluation, then checkpointing (so a checkpoint follows the validation of its iteration), then
the diagnostics, then preemption last, so that a stop request saves only when the checkpoint
callback has not just saved that iteration. A callback stops the run with
``trainer.request_stop()``; the loop ends after the current ``on_step_end`` round.

The trainer is typed under ``TYPE_CHECKING`` only: this module and the diagnostics never import
the loop at run time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from megatron.core.num_microbatches_calculator import get_current_global_batch_size

from megatron_gamma import parallel
from megatron_gamma.model.flops import train_flops_per_token
from megatron_gamma.training.metrics import MetricsLogger
from megatron_gamma.training.params_norm import params_l2_norm
from megatron_gamma.training.preemption import PreemptionGuard

if TYPE_CHECKING:
    from megatron_gamma.config import Config
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


def _due(iteration: int, interval: Optional[int], end: int) -> bool:
    return bool(interval and iteration % interval == 0) or iteration == end


class MetricsCallback(Callback):
    """Console, TensorBoard (every ``--tensorboard-log-interval`` steps), W&B (with
    ``--wandb-project``) and ``metrics.jsonl`` (:class:`~.metrics.MetricsLogger`): every step's
    loss, lr and weight decay in effect, grad norm, global batch size (it grows during a
    ``--rampup-batch-size`` ramp-up), consumed samples and tokens, throughput
    (``--log-throughput``, on by default), memory (:func:`megatron_gamma.parallel.memory_stats`,
    ``--log-memory-to-tensorboard``, on by default), params norm (``--log-params-norm``) and
    zeros in the gradients (``--log-num-zeros-in-grad``); a summary line (with
    ``--log-throughput``: tokens/s, ms/iter, TFLOP/s per device, MFU on known GPUs) every
    ``log_interval`` steps and at the last one; validation losses and perplexities and
    checkpoint messages. Sets ``trainer.log`` for the other callbacks."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def on_train_start(self, trainer: Trainer) -> None:
        cfg = self.cfg
        lg = cfg.logging
        mirror = None
        if lg.wandb_project is not None and trainer.rank == 0:
            from megatron_gamma.training.telemetry import WandbWriter

            mirror = WandbWriter(cfg)
        trainer.log = MetricsLogger(
            lg.run_dir,
            lg.tensorboard_path(),
            active=trainer.rank == 0,
            total_iters=trainer.end_iteration,
            start_iter=trainer.state.iteration,
            progress_bar=lg.progress_bar,
            tensorboard_log_interval=lg.tensorboard_log_interval,
            validation_ppl_to_tensorboard=lg.log_validation_ppl_to_tensorboard,
            mirror=mirror,
        )
        if trainer.state.iteration:
            trainer.log.message(f"resumed at iteration {trainer.state.iteration}")
        self.flops_per_token = train_flops_per_token(cfg, trainer.vocab_size)
        self.peak = parallel.peak_tflops()
        self.interval_start, self.interval_iters, self.interval_tokens = time.time(), 0, 0

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        lg = self.cfg.logging
        samples = trainer.state.consumed_samples
        batch = get_current_global_batch_size()  # the size this step trained on
        tokens = batch * self.cfg.model.seq_length
        values = {
            "loss": step.loss,
            "lr": step.lr,
            "weight_decay": trainer.scheduler.get_wd(),
            "grad_norm": step.grad_norm,
            "global_batch_size": batch,
            "consumed_samples": samples,
            "consumed_tokens": samples * self.cfg.model.seq_length,
        }
        if lg.log_throughput:
            values["tokens_per_s"] = tokens / step.seconds
        if lg.log_memory_to_tensorboard:
            values.update(parallel.memory_stats())
        if lg.log_params_norm:
            values["params_norm"] = params_l2_norm([c.module for c in trainer.chunks])
        if lg.log_num_zeros_in_grad:
            values["num_zeros_in_grad"] = int(trainer.num_zeros_in_grad)
        trainer.log.train_step(step.iteration, values)
        self.interval_iters += 1
        self.interval_tokens += tokens
        if not _due(step.iteration, self.cfg.logging.log_interval, trainer.end_iteration):
            return
        if lg.log_throughput:
            span = time.time() - self.interval_start
            tflops = self.flops_per_token * self.interval_tokens / span / trainer.world_size
            values["tokens_per_s"] = self.interval_tokens / span
            values["ms_per_iter"] = 1000 * span / self.interval_iters
            values["tflops_per_device"] = tflops / 1e12
            if self.peak is not None:
                values["mfu"] = values["tflops_per_device"] / self.peak
        trainer.log.interval_summary(step.iteration, self.cfg.training.train_iters, values)
        self.interval_start, self.interval_iters, self.interval_tokens = time.time(), 0, 0

    def on_eval(self, trainer: Trainer, iteration: int, loss: float) -> None:
        trainer.log.validation(iteration, loss)

    def on_save(self, trainer: Trainer, iteration: int, path: str) -> None:
        trainer.log.message(f"saved checkpoint {path}")

    def on_train_end(self, trainer: Trainer) -> None:
        trainer.log.close()


class EvaluationCallback(Callback):
    """Validation loss every ``eval_interval`` steps and at the last one
    (:meth:`Trainer.evaluate`); fires ``on_eval`` and records ``trainer.result.valid_losses``."""

    def __init__(self, eval_interval: int):
        self.interval = eval_interval

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        if not _due(step.iteration, self.interval, trainer.end_iteration):
            return
        loss = trainer.evaluate()
        if loss is not None:
            trainer.result.valid_losses[step.iteration] = loss
            trainer.fire("on_eval", step.iteration, loss)


class CheckpointCallback(Callback):
    """A checkpoint every ``save_interval`` steps and at the last one, when ``--save`` is set
    (:meth:`Trainer.save`); fires ``on_save`` and records ``trainer.result.checkpoint``."""

    def __init__(self, save: Optional[str], save_interval: Optional[int]):
        self.save, self.interval = save, save_interval

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        if not self.save or not _due(step.iteration, self.interval, trainer.end_iteration):
            return
        trainer.result.checkpoint = trainer.save()
        trainer.fire("on_save", step.iteration, trainer.result.checkpoint)


class PreemptionCallback(Callback):
    """SIGUSR1 / SIGTERM / ``--exit-duration-in-mins`` (:class:`~.preemption.PreemptionGuard`):
    agree across ranks, save unless this iteration was just saved, and stop the run."""

    def __init__(self, guard: PreemptionGuard):
        self.guard = guard

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        last = trainer.result.checkpoint
        stop, checkpoint = self.guard.stop(trainer, step.iteration, last)
        if not stop:
            return
        if checkpoint is not None and checkpoint != last:
            trainer.fire("on_save", step.iteration, checkpoint)
        trainer.result.checkpoint = checkpoint
        trainer.request_stop()


def default_callbacks(cfg: Config, guard: PreemptionGuard) -> list[Callback]:
    """The run's callbacks in their contract order: metrics, evaluation, checkpointing,
    diagnostics (``--log-diagnostics-interval`` > 0), the profiler (``--profile``), manual
    garbage collection (``--manual-gc``), preemption."""
    from megatron_gamma.diagnostics.callback import DiagnosticsCallback

    callbacks: list[Callback] = [
        MetricsCallback(cfg),
        EvaluationCallback(cfg.training.eval_interval),
        CheckpointCallback(cfg.checkpoint.save, cfg.checkpoint.save_interval),
    ]
    if cfg.logging.log_diagnostics_interval:
        callbacks.append(DiagnosticsCallback(cfg.logging.log_diagnostics_interval))
    if cfg.logging.profile:
        from megatron_gamma.training.telemetry import ProfilerCallback

        callbacks.append(ProfilerCallback(cfg))
    if cfg.training.manual_gc:
        from megatron_gamma.training.manual_gc import ManualGCCallback

        t = cfg.training
        callbacks.append(ManualGCCallback(t.manual_gc_interval, t.manual_gc_eval))
    callbacks.append(PreemptionCallback(guard))
    return callbacks

"""The run's built-in callbacks: metrics, evaluation, checkpointing, preemption.

Each owns its cadence and implements the hooks of :class:`~.callback.Callback` (the contract is
written there); :func:`megatron_gamma.training.loop.pretrain` composes them with the diagnostics,
profiler and manual-GC callbacks in an explicit order.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from megatron.core.num_microbatches_calculator import get_current_global_batch_size

from megatron_gamma import parallel
from megatron_gamma.model.flops import train_flops_per_token
from megatron_gamma.training.callback import Callback, StepOutput, due
from megatron_gamma.training.params_norm import params_l2_norm
from megatron_gamma.training.preemption import PreemptionGuard

if TYPE_CHECKING:
    from megatron_gamma.config import Config
    from megatron_gamma.training.loop import Trainer


class MetricsCallback(Callback):
    """Console, TensorBoard (every ``--tensorboard-log-interval`` steps), W&B (with
    ``--wandb-project``) and ``metrics.jsonl`` (:class:`~.metrics.MetricsLogger`): every step's
    loss, lr and weight decay in effect, grad norm, global batch size (it grows during a
    ``--rampup-batch-size`` ramp-up), consumed samples and tokens, throughput
    (``--log-throughput``, on by default), memory (:func:`megatron_gamma.parallel.memory_stats`,
    ``--log-memory-to-tensorboard``, on by default), params norm (``--log-params-norm``) and
    zeros in the gradients (``--log-num-zeros-in-grad``); a summary line (with
    ``--log-throughput``: tokens/s, ms/iter, TFLOP/s per device, MFU on known GPUs) every
    ``log_interval`` steps and at the last one; an MoE model's router auxiliary losses
    (``load_balancing_loss``, ``z_loss``, ...: ``trainer.moe_aux_losses``) every step, and
    their mean over the interval's steps in the summary line, as Megatron-LM prints them;
    validation losses and perplexities and checkpoint messages, all through the trainer's
    ``trainer.log``."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def on_train_start(self, trainer: Trainer) -> None:
        self.flops_per_token = train_flops_per_token(self.cfg, trainer.vocab_size)
        self.peak = parallel.peak_tflops()
        self.interval_start, self.interval_iters, self.interval_tokens = time.time(), 0, 0
        self.interval_moe: dict[str, float] = {}

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
            "consumed_tokens": trainer.state.consumed_tokens,
        }
        if lg.log_throughput:
            values["tokens_per_s"] = tokens / step.seconds
        if lg.log_memory_to_tensorboard:
            values.update(parallel.memory_stats())
        if lg.log_params_norm:
            values["params_norm"] = params_l2_norm([c.module for c in trainer.chunks])
        if lg.log_num_zeros_in_grad:
            values["num_zeros_in_grad"] = int(trainer.num_zeros_in_grad)
        values.update(trainer.moe_aux_losses)
        trainer.log.train_step(step.iteration, values)
        self.interval_iters += 1
        self.interval_tokens += tokens
        for name, value in trainer.moe_aux_losses.items():
            self.interval_moe[name] = self.interval_moe.get(name, 0.0) + value
        if not due(step.iteration, self.cfg.logging.log_interval, trainer.end_iteration):
            return
        if lg.log_throughput:
            span = time.time() - self.interval_start
            tflops = self.flops_per_token * self.interval_tokens / span / trainer.world_size
            values["tokens_per_s"] = self.interval_tokens / span
            values["ms_per_iter"] = 1000 * span / self.interval_iters
            values["tflops_per_device"] = tflops / 1e12
            if self.peak is not None:
                values["mfu"] = values["tflops_per_device"] / self.peak
        moe = {name: total / self.interval_iters for name, total in self.interval_moe.items()}
        total_iters = self.cfg.training.train_iters
        trainer.log.interval_summary(step.iteration, total_iters, values, moe_losses=moe)
        self.interval_start, self.interval_iters, self.interval_tokens = time.time(), 0, 0
        self.interval_moe = {}

    def on_eval(self, trainer: Trainer, iteration: int, loss: float) -> None:
        trainer.log.validation(iteration, loss)

    def on_save(self, trainer: Trainer, iteration: int, path: str) -> None:
        trainer.log.message(f"saved checkpoint {path}")


class EvaluationCallback(Callback):
    """Validation loss every ``eval_interval`` steps and at the last one
    (:meth:`Trainer.evaluate`); fires ``on_eval`` and records ``trainer.result.valid_losses``."""

    def __init__(self, eval_interval: int):
        self.interval = eval_interval

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        if not due(step.iteration, self.interval, trainer.end_iteration):
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
        if not self.save or not due(step.iteration, self.interval, trainer.end_iteration):
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

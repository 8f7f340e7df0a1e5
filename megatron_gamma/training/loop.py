"""The pretraining loop, on megatron-core's schedules, optimizer, LR scheduler and checkpoints.

One iteration::

    zero grads -> get_forward_backward_func()(micro-batches) -> optimizer.step() (clips, returns
    the grad norm) -> scheduler.step() -> log / evaluate / save

Everything distributed (DDP gradient all-reduce, pipeline p2p, TP collectives) happens inside
megatron-core; this file only wires it and keeps the progress counters.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.num_microbatches_calculator import (
    destroy_num_microbatches_calculator,
    get_num_microbatches,
    init_num_microbatches_calculator,
)
from megatron.core.optimizer import OptimizerConfig as McoreOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_gamma import parallel
from megatron_gamma.config import Config, ConfigError, save_config
from megatron_gamma.data import demo_dir
from megatron_gamma.data.datasets import build_datasets, check_splits, micro_batches
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.diagnostics.callback import DiagnosticsCallback
from megatron_gamma.model.builder import build_model, padded_vocab_size, transformer_config
from megatron_gamma.model.flops import train_flops_per_token
from megatron_gamma.training.checkpointing import (
    TrainState,
    load_checkpoint,
    save_checkpoint,
    saved_schedule,
)
from megatron_gamma.training.init_audit import audit_init, format_audit, write_audit
from megatron_gamma.training.metrics import MetricsLogger
from megatron_gamma.training.preemption import PreemptionGuard
from megatron_gamma.training.schedule import build_scheduler, reconcile_schedule


@dataclass
class TrainResult:
    """What a finished run reports (on every rank)."""

    train_losses: dict[int, float] = field(default_factory=dict)
    valid_losses: dict[int, float] = field(default_factory=dict)
    iteration: int = 0
    checkpoint: str | None = None


def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Mean next-token cross-entropy over unmasked tokens of one micro-batch."""
    mask = loss_mask.float().view(-1)
    loss = (output_tensor.float().view(-1) * mask).sum() / mask.sum()
    return loss, {"lm loss": loss.detach().clone()}  # the schedule scales `loss` in place


def _forward_step(device: torch.device, data_iterator, model):
    """megatron-core forward_step_func: (output per-token losses, loss function)."""
    batch = {k: v.to(device) for k, v in next(data_iterator).items()}
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


def _reduce_loss(results: list[dict]) -> float:
    """Mean loss of this step across micro-batches and data-parallel ranks, on every rank.

    Only the last pipeline stage holds losses; a world all-reduce with zeros elsewhere carries
    the value to every rank (rank 0 logs).
    """
    value = torch.zeros(2, dtype=torch.float64)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if last and parallel_state.get_tensor_model_parallel_rank() == 0 and results:
        value[0] = sum(float(r["lm loss"]) for r in results) / len(results)
        value[1] = 1.0
    dist.all_reduce(value)
    return float(value[0] / value[1])


def preflight(cfg: Config) -> str:
    """Checks that need files, run before any process group or model exists.

    Returns:
        The tokenizer.json path (``data.tokenizer_model`` or the packaged demo tokenizer).

    Raises:
        ConfigError: missing dataset prefix or tokenizer file; MoE with tensor parallelism but
            without sequence parallelism (megatron-core's MoE layer refuses it in training).
    """
    par = cfg.parallel
    if cfg.model.num_experts and par.tensor_model_parallel_size > 1 and not par.sequence_parallel:
        raise ConfigError(
            "sequence_parallel=False: megatron-core's MoE layer refuses to train with "
            f"tensor_model_parallel_size={par.tensor_model_parallel_size} without sequence "
            "parallelism. Fix: add --sequence-parallel"
        )
    prefixes, _ = cfg.data.blend()
    if cfg.data.blend_per_split() is None:
        check_splits(prefixes, cfg.data.split)
    path = cfg.data.tokenizer_model or os.path.join(demo_dir(), "tokenizer.json")
    if not os.path.isfile(path):
        raise ConfigError(
            f"tokenizer_model={path!r}: file not found. Fix: pass the tokenizer.json used by "
            "`megatron-gamma preprocess`"
        )
    return path


class Trainer:
    """Builds everything a run needs from a Config and trains it.

    Callbacks (``self.callbacks``) get ``cb.on_step_end(trainer, iteration)`` once at the end of
    every iteration; ``--log-diagnostics-interval`` adds the diagnostics callback.

    Args:
        cfg: validated run config.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.preemption = PreemptionGuard(cfg.training.exit_duration_in_mins)
        tok_path = preflight(cfg)
        self.callbacks: list = []
        if cfg.logging.log_diagnostics_interval:
            self.callbacks.append(DiagnosticsCallback(cfg.logging.log_diagnostics_interval))
        self.log: MetricsLogger | None = None
        self.dp_size = parallel.initialize(cfg)
        load = cfg.checkpoint.load
        cfg = reconcile_schedule(cfg, saved_schedule(load) if load else None, load)
        self.cfg = cfg
        self.device = torch.device("cuda") if parallel.uses_gpu() else torch.device("cpu")
        self.rank = dist.get_rank()
        run_dir = cfg.logging.run_dir
        if self.rank == 0:
            os.makedirs(run_dir, exist_ok=True)
            save_config(cfg, os.path.join(run_dir, "config.yaml"))
        self.tokenizer = BilingualTokenizer(tok_path)
        self.vocab_size = padded_vocab_size(
            max(self.tokenizer.vocab_size, cfg.model.vocab_size or 0), cfg
        )
        self.datasets = build_datasets(cfg, self.tokenizer)
        t = cfg.training
        init_num_microbatches_calculator(
            self.rank, None, t.global_batch_size, t.micro_batch_size, self.dp_size
        )
        self.tcfg = transformer_config(cfg, on_gpu=parallel.uses_gpu())
        self.chunks, self.init_plan = self._build_model()
        self.init_audit = audit_init([c.module for c in self.chunks], cfg, self.vocab_size)
        if self.rank == 0:
            print(format_audit(self.init_audit), flush=True)
            write_audit(self.init_audit, run_dir)
            flagged = [r["name"] for r in self.init_audit if r["flagged"]]
            if flagged:
                print(f"WARNING: init audit flags {len(flagged)} parameters: {flagged}", flush=True)
        self.optimizer = get_megatron_optimizer(self._optimizer_config(), self.chunks)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.state = TrainState()
        if cfg.checkpoint.load:
            restored = load_checkpoint(
                cfg.checkpoint.load, self.chunks, self.optimizer, self.scheduler
            )
            if restored is not None:
                self.state = restored

    def _build_model(self):
        chunks, plan = build_model(self.cfg, self.tcfg, self.vocab_size)
        p = self.cfg.parallel
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            use_distributed_optimizer=p.use_distributed_optimizer,
            overlap_grad_reduce=p.overlap_grad_reduce,
        )
        wrapped = []
        for i, chunk in enumerate(chunks):
            chunk.to(self.device)
            wrapped.append(
                DistributedDataParallel(
                    config=self.tcfg,
                    ddp_config=ddp_config,
                    module=chunk,
                    disable_bucketing=i > 0,  # Megatron-LM: only the first chunk overlaps
                )
            )
        no_sync = [c.no_sync for c in wrapped]
        self.tcfg.no_sync_func = no_sync if len(wrapped) > 1 else no_sync[0]
        if p.overlap_grad_reduce:
            sync = [c.start_grad_sync for c in wrapped]
            self.tcfg.grad_sync_func = sync if len(wrapped) > 1 else sync[0]
        self.tcfg.finalize_model_grads_func = finalize_model_grads
        return wrapped, plan

    def _optimizer_config(self) -> McoreOptimizerConfig:
        o = self.cfg.optimizer
        return McoreOptimizerConfig(
            optimizer=o.optimizer,
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            bf16=self.cfg.training.bf16,
            params_dtype=self.tcfg.params_dtype,
            use_distributed_optimizer=self.cfg.parallel.use_distributed_optimizer,
        )

    def _iterator(self, dataset, start_sample: int):
        """The schedule's data iterator: one per model chunk with virtual pipelining."""
        t = self.cfg.training

        def make():
            return micro_batches(
                dataset,
                start_sample,
                t.micro_batch_size,
                parallel_state.get_data_parallel_rank(),
                self.dp_size,
            )

        return [make() for _ in self.chunks] if len(self.chunks) > 1 else make()

    def _run_schedule(self, data_iterator, forward_only: bool) -> float:
        results = get_forward_backward_func()(
            forward_step_func=partial(_forward_step, self.device),
            data_iterator=data_iterator,
            model=self.chunks,
            num_microbatches=get_num_microbatches(),
            seq_length=self.cfg.model.seq_length,
            micro_batch_size=self.cfg.training.micro_batch_size,
            forward_only=forward_only,
        )
        return _reduce_loss(results)

    def train_step(self, data_iterator) -> tuple[float, float, float]:
        """One optimizer step. Returns (loss, grad norm, learning rate used)."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss = self._run_schedule(data_iterator, forward_only=False)
        _, grad_norm, _ = self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step(increment=1)
        return loss, float(grad_norm or 0.0), lr

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss over ``eval_iters`` global batches of the validation split."""
        valid = self.datasets[1]
        if valid is None or len(valid) == 0:
            return None
        for chunk in self.chunks:
            chunk.eval()
        iterator = self._iterator(valid, 0)
        losses = [
            self._run_schedule(iterator, forward_only=True)
            for _ in range(self.cfg.training.eval_iters)
        ]
        for chunk in self.chunks:
            chunk.train()
        return sum(losses) / len(losses)

    def save(self) -> str:
        """Checkpoint under ``checkpoint.save``."""
        return save_checkpoint(
            self.cfg.checkpoint.save, self.chunks, self.optimizer, self.scheduler, self.state
        )

    def train(self) -> TrainResult:
        """Run from the current state to ``train_iters`` (or ``exit_interval``)."""
        cfg, t = self.cfg, self.cfg.training
        end = min(t.train_iters, t.exit_interval or t.train_iters)
        log = MetricsLogger(
            cfg.logging.run_dir,
            cfg.logging.tensorboard_dir or os.path.join(cfg.logging.run_dir, "tensorboard"),
            active=self.rank == 0,
            total_iters=end,
            start_iter=self.state.iteration,
            progress_bar=cfg.logging.progress_bar,
        )
        self.log = log
        result = TrainResult()
        if self.state.iteration:
            log.message(f"resumed at iteration {self.state.iteration}")
        iterator = self._iterator(self.datasets[0], self.state.consumed_samples)
        tokens_per_iter = t.global_batch_size * cfg.model.seq_length
        flops_per_iter = train_flops_per_token(cfg, self.vocab_size) * tokens_per_iter
        peak = parallel.peak_tflops()
        world = dist.get_world_size()
        interval_start, interval_iters = time.time(), 0
        while self.state.iteration < end:
            step_start = time.time()
            loss, grad_norm, lr = self.train_step(iterator)
            self.state.iteration += 1
            self.state.consumed_samples += t.global_batch_size
            it = self.state.iteration
            elapsed = time.time() - step_start
            values = {
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_iter / elapsed,
            }
            log.train_step(it, values)
            result.train_losses[it] = loss
            interval_iters += 1
            if it % cfg.logging.log_interval == 0 or it == end:
                span = time.time() - interval_start
                values["tokens_per_s"] = tokens_per_iter * interval_iters / span
                values["ms_per_iter"] = 1000 * span / interval_iters
                values["tflops_per_device"] = flops_per_iter * interval_iters / span / world / 1e12
                if peak is not None:
                    values["mfu"] = values["tflops_per_device"] / peak
                log.interval_summary(it, t.train_iters, values)
                interval_start, interval_iters = time.time(), 0
            if it % t.eval_interval == 0 or it == end:
                val = self.evaluate()
                if val is not None:
                    log.validation(it, val)
                    result.valid_losses[it] = val
            interval = cfg.checkpoint.save_interval
            if cfg.checkpoint.save and ((interval and it % interval == 0) or it == end):
                result.checkpoint = self.save()
                log.message(f"saved checkpoint {result.checkpoint}")
            for callback in self.callbacks:
                callback.on_step_end(self, it)
            stop, checkpoint = self.preemption.stop(self, it, result.checkpoint)
            if stop:
                result.checkpoint = checkpoint
                break
        result.iteration = self.state.iteration
        log.close()
        return result

    def close(self) -> None:
        """Release megatron-core globals and the process group."""
        destroy_num_microbatches_calculator()
        parallel.destroy()


def pretrain(cfg: Config) -> TrainResult:
    """Build, train, checkpoint, tear down. See :class:`Trainer`."""
    trainer = Trainer(cfg)
    try:
        return trainer.train()
    finally:
        trainer.close()

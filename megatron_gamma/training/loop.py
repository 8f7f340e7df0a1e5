"""The pretraining loop, on megatron-core's schedules, optimizer, LR scheduler and checkpoints.

One iteration::

    zero grads -> get_forward_backward_func()(micro-batches) -> optimizer.step() (clips, returns
    the grad norm) -> scheduler.step() -> on_step_end hooks (metrics, evaluation, checkpoint,
    diagnostics, preemption: :mod:`megatron_gamma.training.callback`, composed by
    :func:`pretrain`)

Everything distributed (DDP gradient all-reduce, pipeline p2p, TP collectives) happens inside
megatron-core; this file only wires it and keeps the progress counters.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from megatron.core.num_microbatches_calculator import (
    destroy_num_microbatches_calculator,
    get_current_global_batch_size,
    get_num_microbatches,
    init_num_microbatches_calculator,
    update_num_microbatches,
)
from megatron.core.optimizer import OptimizerConfig as McoreOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_gamma import parallel
from megatron_gamma.config import Config, check_moe_training, save_config
from megatron_gamma.data.datasets import (
    build_datasets,
    check_split_paths,
    check_splits,
    micro_batches,
)
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.data.tokenizer_fingerprint import check_datasets, fingerprint
from megatron_gamma.data.tokenizer_types import load_tokenizer
from megatron_gamma.diagnostics.callback import DiagnosticsCallback
from megatron_gamma.model.builder import build_model, transformer_config
from megatron_gamma.model.te_backend import check_backend
from megatron_gamma.model.vocab import model_vocab_size
from megatron_gamma.rundir.layout import (
    CONFIG,
    INIT_AUDIT,
    METRICS,
    check_resume_init,
    checkpoint_dir,
    continue_metrics,
    continue_tensorboard,
    describe,
    description,
    read_common,
    section_changes,
    seq_length_warning,
    set_aside_earlier_run,
    superseded_note,
)
from megatron_gamma.rundir.loader import check_tokenizer
from megatron_gamma.rundir.paths import check_output_dir, check_save_dir, write_launch_dir
from megatron_gamma.training.callback import Callback, StepOutput
from megatron_gamma.training.checkpointing import (
    TrainState,
    check_load_dir,
    check_loadable,
    claim_run_dir,
    claim_save_dir,
    latest_iteration,
    load_checkpoint,
    load_weights,
    missing_load_warning,
    release_lock,
    save_checkpoint,
)
from megatron_gamma.training.errors import NonFiniteLossError
from megatron_gamma.training.init_audit import (
    audit_init,
    format_audit,
    format_summary,
    summarize_audit,
    write_audit,
)
from megatron_gamma.training.manual_gc import ManualGCCallback
from megatron_gamma.training.metrics import MetricsLogger
from megatron_gamma.training.moe_metrics import MoeAuxLosses, tracked_names
from megatron_gamma.training.precision import (
    check_precision,
    fp16_epsilon_warning,
    grad_reduce_in_fp32,
    loss_scaling,
)
from megatron_gamma.training.preemption import PreemptionGuard
from megatron_gamma.training.run_callbacks import (
    CheckpointCallback,
    EvaluationCallback,
    MetricsCallback,
    PreemptionCallback,
)
from megatron_gamma.training.schedule import build_scheduler, reconcile_schedule, warmup_warning
from megatron_gamma.training.telemetry import (
    ProfilerCallback,
    WandbWriter,
    check_telemetry,
    start_wandb,
)


def check_finite(iteration: int, loss: float, grad_norm: float) -> None:
    """Megatron-LM's ``--check-for-nan-in-loss-and-grad``: stop at a NaN or inf loss or
    gradient norm (both the same on every rank: the loss is all-reduced, the norm global).

    Raises:
        NonFiniteLossError: naming the iteration, the values and the fixes.
    """
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    fix = (
        "a lower --lr or a longer --lr-warmup-iters, --clip-grad, or resume from an earlier "
        "checkpoint"
    )
    if iteration == 1 and not math.isfinite(loss):  # trial 16: the first loss precedes any step
        fix = (
            "the loss of iteration 1 is computed before any update, so not the learning rate: "
            "check the starting weights (the init audit above: --init-method-std, --init-gamma; "
            "or those of --pretrained-checkpoint), the precision and the data"
        )
    raise NonFiniteLossError(
        f"iteration {iteration}: training loss {loss}, grad norm {grad_norm}: not finite, so the "
        "run stops here (--check-for-nan-in-loss-and-grad, on by default as in Megatron-LM); "
        f"this iteration is neither logged nor saved. Fix: {fix}; "
        "--no-check-for-nan-in-loss-and-grad trains on regardless"
    )


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
    """megatron-core forward_step_func: (output per-token losses, loss function). The batch's
    attention_mask (``--reset-attention-mask``) reaches the core attention; without it the
    attention is causal."""
    batch = {k: v.to(device) for k, v in next(data_iterator).items()}
    mask = batch.get("attention_mask")
    output = model(batch["tokens"], batch["position_ids"], mask, labels=batch["labels"])
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


def preflight(cfg: Config) -> BilingualTokenizer:
    """Checks that need files, run before any process group or model exists. A ``--load``
    that does not exist gets a warning (:func:`~.checkpointing.missing_load_warning`); one that
    is a file is refused (:func:`~.checkpointing.check_load_dir`).

    Returns:
        The run's tokenizer (:func:`~megatron_gamma.data.tokenizer_types.load_tokenizer`:
        ``--tokenizer-type`` with its files, default the packaged demo tokenizer).

    Raises:
        ConfigError: missing dataset prefix (unless ``--mock-data``) or tokenizer file; a
            dataset tokenized with another tokenizer (its fingerprint, :mod:`megatron_gamma.
            data.tokenizer_fingerprint`; a dataset without one gets a warning); a split that is
            empty or holds fewer than ``seq_length + 1`` tokens (:func:`~megatron_gamma.data.
            datasets.check_splits`, :func:`~megatron_gamma.data.datasets.check_split_paths`);
            MoE with tensor parallelism but without sequence parallelism
            (megatron-core's MoE layer refuses it in training); a checkpoint to load that lacks
            what the load needs (:func:`~.checkpointing.check_loadable`) or that was trained
            with another tokenizer (:func:`~megatron_gamma.rundir.loader.check_tokenizer`; one
            without a tokenizer fingerprint gets a warning); a backend this machine
            cannot run (:func:`~megatron_gamma.model.te_backend.check_backend`: Transformer
            Engine, FP8); logging flags this machine cannot serve (:func:`~.telemetry.
            check_telemetry`); a ``--data-cache-path`` or ``--tensorboard-dir`` that cannot be
            made or written into (:func:`~megatron_gamma.rundir.paths.check_output_dir`); a
            ``--save`` directory
            holding checkpoints this run does not load, without ``--load`` or ``--overwrite``
            (:func:`~megatron_gamma.rundir.paths.check_save_dir`); a
            resume with other initialization settings than the checkpoint's run
            (:func:`~megatron_gamma.rundir.layout.check_resume_init`).
    """
    check_backend(cfg)
    ck = cfg.checkpoint
    check_save_dir(ck.save, ck.load, ck.overwrite)
    check_load_dir(ck.load)
    resume = ck.load and latest_iteration(ck.load) is not None
    root = ck.load if resume else ck.pretrained_checkpoint
    newest = latest_iteration(root) if root else None
    ckpt = None if newest is None else checkpoint_dir(root, newest)
    # the checkpoint's common state, read once for the checks of the load, tokenizer and init
    common = None if ckpt is None else read_common(ckpt)
    if ck.load and (ck.finetune or resume):  # common is ck.load's where check_loadable reads it
        check_loadable(ck.load, ck.finetune, ck.load_optim, common=common)
    elif ck.pretrained_checkpoint:
        check_loadable(ck.pretrained_checkpoint, True, False, "pretrained_checkpoint")
    check_moe_training(cfg)
    check_telemetry(cfg)
    # RUN/data_cache, RUN/tensorboard: claim_run_dir checks RUN
    for key, path in (
        ("data_cache_path", cfg.data.data_cache_path),
        ("tensorboard_dir", cfg.logging.tensorboard_dir),
    ):
        if path is not None:
            check_output_dir(path, key)
    warning = missing_load_warning(ck.load, ck.save, ck.pretrained_checkpoint)
    if warning and parallel.read_dist_env().rank == 0:
        print(f"WARNING: {warning}", flush=True)
    tokenizer = load_tokenizer(cfg.data, cfg.logging.run_dir)
    if ckpt is not None:
        warning = check_tokenizer(ckpt, cfg, "pass the checkpoint's tokenizer ({flags})", common)
        if warning and parallel.read_dist_env().rank == 0:
            print(warning, flush=True)
    if resume and not ck.finetune:  # root is ck.load
        saved = description(common)[0]
        check_resume_init(cfg, saved, ck.load)
        warning = seq_length_warning(cfg, saved)
        if warning and parallel.read_dist_env().rank == 0:
            print(warning, flush=True)
        if ck.overwrite and parallel.read_dist_env().rank == 0:
            print(
                f"WARNING: overwrite=True: no effect, this run resumes from load={ck.load!r} "
                "(nothing is deleted or moved aside). Fix: to start afresh, drop --load",
                flush=True,
            )
    if cfg.data.mock_data:
        return tokenizer
    per_split = cfg.data.blend_per_split()
    read = ("train", "valid") if cfg.training.eval_iters > 0 else ("train",)
    if per_split is None:
        prefixes, _ = cfg.data.blend()
    else:
        check_split_paths(per_split, cfg.model.seq_length, read)
        prefixes = [p for blend in per_split if blend is not None for p in blend[0]]
    # the tokenizer first: a dataset of another tokenizer is the mistake to fix before its split
    warnings = check_datasets(list(dict.fromkeys(prefixes)), tokenizer)
    if warnings and parallel.read_dist_env().rank == 0:
        print("\n".join(warnings), flush=True)
    if per_split is None:
        check_splits(prefixes, cfg.data.split, cfg.model.seq_length, read)
    return tokenizer


class Trainer:
    """Builds everything a run needs from a Config and trains it.

    ``self.callbacks`` get the hooks of :class:`~.callback.Callback`; empty here,
    :func:`pretrain` sets the run's list (:func:`run_callbacks`). The trainer owns its logger,
    ``self.log`` (:class:`~.metrics.MetricsLogger`, written on rank 0), open from just before
    ``on_train_start`` to just after ``on_train_end``. ``self.weights_from`` is the checkpoint
    whose weights replace the initialization (:meth:`_weights_source`), or None.

    ``self.preemption`` (:class:`~.preemption.PreemptionGuard`) handles SIGUSR1 and SIGTERM
    (not SIGTERM with ``--no-exit-signal-handler``) from construction on, but only a
    :class:`~.run_callbacks.PreemptionCallback` of it (:func:`run_callbacks`) acts on a signal
    it records, saving a checkpoint and stopping the loop. :meth:`train` without one gives the
    signals back to the handlers they had before the trainer was built, and a signal recorded
    while it was built (a SIGUSR1 during start-up) is sent on to them
    (:meth:`~.preemption.PreemptionGuard.release`; Python's default ends the process, killed
    by the signal: exit status 143 for SIGTERM). Stopping the loop instead would return from
    :meth:`train` as if training were done, with nothing saved, and the caller would carry on
    with a shorter run than it asked for; a caller that adds no preemption callback asked for
    no preemption handling, so the signals act as they would without a trainer.
    ``--exit-duration-in-mins`` is likewise read by that callback only. :meth:`close`, and a
    construction that raises, give the signals back as well: after :func:`pretrain` returns or
    raises, SIGUSR1 and SIGTERM have the handlers they had before it was called, and the
    run-directory and ``--save`` locks and the process group it made are released, so the same
    process can call it again.

    Args:
        cfg: validated run config.
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.preemption = PreemptionGuard(
            cfg.training.exit_duration_in_mins, cfg.training.exit_signal_handler
        )
        self.run_lock = self.save_lock = None
        self._parallel = False
        try:
            self._build(cfg)
        except BaseException:
            self.close()  # no trainer: what _build took (signals, locks, process group) goes back
            raise

    def _build(self, cfg: Config) -> None:
        """Everything the trainer holds but its preemption guard (see the class docstring)."""
        self.tokenizer = preflight(cfg)
        check_precision(cfg, parallel.uses_gpu())
        self.log: MetricsLogger | None = None
        self.result = TrainResult()
        self.end_iteration = cfg.training.train_iters
        self._stop = False
        self._parallel = True
        self.dp_size = parallel.initialize(cfg)
        ck = cfg.checkpoint
        self.run_lock, self.takeover = claim_run_dir(cfg.logging.run_dir, ck.load, ck.overwrite)
        self.save_lock = claim_save_dir(ck.save, ck.overwrite and not ck.load)
        load = cfg.checkpoint.load
        resume = load and not cfg.checkpoint.finetune
        newest = latest_iteration(load) if resume else None
        common = {} if newest is None else read_common(checkpoint_dir(load, newest))
        saved = description(common)[0]
        changes = section_changes(cfg, saved, "model")
        training = section_changes(cfg, saved, "training")
        batch = [c for c in training if c.startswith("global_batch_size=")]
        cfg = reconcile_schedule(cfg, common.get("scheduler"), load, changes, batch)
        self.cfg, self.model_changes = cfg, tuple(changes)
        self.callbacks: list[Callback] = []
        self.device = torch.device("cuda") if parallel.uses_gpu() else torch.device("cpu")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        run_dir = cfg.logging.run_dir
        if self.rank == 0:
            for warning in (fp16_epsilon_warning(cfg), warmup_warning(cfg)):
                if warning:
                    print(f"WARNING: {warning}", flush=True)
        self.vocab_size = model_vocab_size(cfg, self.tokenizer.vocab_size)
        if self.rank == 0:
            self._warn_memory()
        self.datasets = build_datasets(cfg, self.tokenizer)
        t = cfg.training
        init_num_microbatches_calculator(
            self.rank, t.rampup_batch_size, t.global_batch_size, t.micro_batch_size, self.dp_size
        )
        self.tcfg = transformer_config(cfg, on_gpu=parallel.uses_gpu())
        self.chunks, self.init_plan = self._build_model()
        names = tracked_names(cfg.model)
        self.moe_losses = MoeAuxLosses(names, cfg.model, self.device) if names else None
        self.moe_aux_losses: dict[str, float] = {}
        self.weights_from = self._weights_source()
        self.init_audit = self._audit_init(run_dir)
        self.optimizer = get_megatron_optimizer(self._optimizer_config(), self.chunks)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.state = self._load()
        # once the load has passed: a refused resume opens no W&B run
        self.wandb: WandbWriter | None = start_wandb(cfg)
        if self.rank == 0:
            self._write_run_records(run_dir)

    def _write_run_records(self, run_dir: str) -> None:
        """Write what the run directory records of this run's start (rank 0), once every check
        and the checkpoint load have passed, so that a refused run (a resume with another model
        shape, say) changes nothing in a run directory it shares with the run it would continue:
        a fresh start first moves an earlier run's ``init_audit.json`` and ``analysis/`` aside
        (:func:`~megatron_gamma.rundir.layout.set_aside_earlier_run`), and so does a resume that
        takes over the directory of a run that never finished an iteration (``self.takeover``,
        the line saying so, printed first: :func:`~.checkpointing.claim_run_dir`), with that
        run's ``metrics.jsonl`` and ``tensorboard/`` (none of their records are the resumed
        run's), then each start writes ``config.yaml`` (the resolved config), ``launch.json``
        (the directory its relative paths were opened from: :func:`~megatron_gamma.rundir.
        paths.write_launch_dir`) and, a fresh start, the init audit's ``init_audit.json``
        (measured by :meth:`_audit_init`). All are written before the first iteration, so a run
        that stops later leaves them."""
        os.makedirs(run_dir, exist_ok=True)
        resumes = self._resumes()
        if self.takeover is not None:
            print(self.takeover, flush=True)
        if not resumes or self.takeover is not None:
            moved = set_aside_earlier_run(run_dir)
            if resumes:  # a fresh start's logger moves these (MetricsLogger)
                moved.append(continue_metrics(run_dir, 0))
                moved.append(continue_tensorboard(os.path.join(run_dir, "tensorboard"), 0)[0])
            for line in filter(None, moved):
                print(line, flush=True)
            if resumes and any(moved):  # a fresh start's logger says it after its own moves
                print(superseded_note(run_dir), flush=True)
        save_config(self.cfg, os.path.join(run_dir, CONFIG))
        write_launch_dir(run_dir)
        if self.init_audit:
            write_audit(self.init_audit, run_dir)

    def _warn_memory(self) -> None:
        """Print :func:`~megatron_gamma.estimate.memory_warning` against GPU 0's memory, or on
        CPU the host's available memory shared by the processes torchrun started on it
        (``LOCAL_WORLD_SIZE``), before the model is built: a run that cannot fit would
        otherwise go silent until the kernel kills it."""
        import psutil

        from megatron_gamma.estimate import memory_warning

        if self.device.type == "cuda":
            available = torch.cuda.get_device_properties(self.device).total_memory
            where = "this GPU's memory"
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            available = psutil.virtual_memory().available / local
            where = f"this host's available memory shared by {local} process" + "es" * (local > 1)
        warning = memory_warning(self.cfg, self.vocab_size, self.world_size, available, where)
        if warning:
            print(f"WARNING: {warning}", flush=True)

    def _load(self) -> TrainState:
        """Progress after loading what ``--load`` / ``--finetune`` / ``--pretrained-checkpoint``
        / ``--no-load-optim`` / ``--no-load-rng`` / ``--dist-ckpt-strictness`` ask for
        (preflight has checked that the checkpoint holds it)."""
        ck = self.cfg.checkpoint
        weights_from = self.weights_from
        if weights_from is None:
            return TrainState()
        if self._resumes():
            restored = load_checkpoint(
                ck.load,
                self.chunks,
                self.optimizer,
                self.scheduler,
                ck.load_optim,
                ck.load_rng,
                ck.dist_ckpt_strictness,
                self.model_changes,
            )
            return restored or TrainState()
        iteration = load_weights(weights_from, self.chunks, self.optimizer, ck.dist_ckpt_strictness)
        if self.rank == 0:
            print(
                f"loaded the weights of {weights_from} (iteration {iteration}); starting at "
                "iteration 0 with a fresh optimizer and schedule",
                flush=True,
            )
        return TrainState()

    def _resumes(self) -> bool:
        """Whether this run continues the run of ``--load`` (its iteration, optimizer and
        schedule; not ``--finetune``, which takes the weights alone and starts at iteration 0)."""
        ck = self.cfg.checkpoint
        return self.weights_from is not None and self.weights_from == ck.load and not ck.finetune

    def _weights_source(self) -> str | None:
        """The checkpoint whose weights replace the initialization: ``--load`` when it holds a
        checkpoint (resumed, or its weights only with ``--finetune``), else
        ``--pretrained-checkpoint``; None when the run trains from its initialization."""
        ck = self.cfg.checkpoint
        if ck.load and latest_iteration(ck.load) is not None:
            return ck.load
        return ck.pretrained_checkpoint or None

    def _audit_init(self, run_dir: str) -> list[dict]:
        """The start-up init audit of ``--init-audit`` (none for 'off'); rank 0 prints the
        per-role summary (:func:`~.init_audit.summarize_audit`) and the flagged parameters'
        rows; the full per-parameter table it returns goes to init_audit.json once the
        checkpoint load has passed (:meth:`_write_run_records`). It measures the
        initialization this config gives; when a checkpoint's weights replace it
        (``self.weights_from``: ``--finetune``, ``--pretrained-checkpoint``), the header says
        so. A resume measures nothing and keeps the run's init_audit.json, the audit of the
        initialization its weights were trained from (its iteration 0); it names that file where
        ``run_dir`` holds one, else says the audit is not there (a resume into a new
        ``--run-dir``: the run's start wrote it, if at all, in its own run directory)."""
        scope = self.cfg.init.init_audit
        if scope == "off":
            return []
        if self._resumes():
            if self.rank == 0:
                path = os.path.join(run_dir, INIT_AUDIT)
                where = (
                    f"the run's own audit, from its start, stays in {path}"
                    if os.path.isfile(path) and self.takeover is None
                    else f"the audit of the run's start is not in this run directory ({run_dir}): "
                    "it was written, if at all, in the run directory that started the run"
                )
                print(
                    f"init audit: not measured on a resume (the weights of {self.weights_from} "
                    f"replace the initialization); {where}",
                    flush=True,
                )
            return []
        rows = audit_init([c.module for c in self.chunks], self.cfg, self.vocab_size, scope=scope)
        if self.rank == 0:
            path = os.path.join(run_dir, INIT_AUDIT)  # written once the load passed
            replaced = (
                f"; the weights of {self.weights_from}, loaded next, replace this "
                "initialization, so it does not describe the weights trained"
                if self.weights_from
                else ""
            )
            print(
                f"init audit ({scope}): {len(rows)} parameters, full table in {path}{replaced}\n"
                + format_summary(summarize_audit(rows)),
                flush=True,
            )
            flagged = [r for r in rows if r["flagged"]]
            if flagged:
                print(format_audit(flagged), flush=True)
                names = [r["name"] for r in flagged]
                print(f"WARNING: init audit flags {len(names)} parameters: {names}", flush=True)
        return rows

    def _build_model(self):
        chunks, plan = build_model(self.cfg, self.tcfg, self.vocab_size)
        p = self.cfg.parallel
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=grad_reduce_in_fp32(self.cfg),
            use_distributed_optimizer=p.use_distributed_optimizer,
            overlap_grad_reduce=p.overlap_grad_reduce,
            overlap_param_gather=p.overlap_param_gather,
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
        return wrapped, plan

    def sync_params(self) -> None:
        """Finish the distributed optimizer's parameter all-gather now, where
        ``--overlap-param-gather`` defers it to the next forward pass: before anything reads the
        weights outside a forward pass (a checkpoint, the weight diagnostics, the caller after
        training). megatron-core ``DistributedDataParallel.start_param_sync(force_sync=True)``,
        as Megatron-LM's ``disable_forward_pre_hook``; no-op without the flag. Collective."""
        if self.cfg.parallel.overlap_param_gather:
            for chunk in self.chunks:
                chunk.start_param_sync(force_sync=True)

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
            sgd_momentum=o.sgd_momentum,
            clip_grad=o.clip_grad,
            bf16=self.cfg.training.bf16,
            **loss_scaling(self.cfg),
            params_dtype=self.tcfg.params_dtype,
            use_distributed_optimizer=self.cfg.parallel.use_distributed_optimizer,
            log_num_zeros_in_grad=self.cfg.logging.log_num_zeros_in_grad,
        )

    def _iterator(self, dataset, start_sample: int):
        """One iterator over this data-parallel rank's micro-batches from ``start_sample``."""
        t = self.cfg.training
        return micro_batches(
            dataset,
            start_sample,
            t.micro_batch_size,
            parallel_state.get_data_parallel_rank(),
            self.dp_size,
            self.cfg.data.num_workers,
        )

    def _schedule_input(self, batch_iter: Iterator[dict], num_microbatches: int):
        """The schedule's data iterator: with virtual pipelining one per model chunk, each over
        the same ``num_microbatches`` batches."""
        if len(self.chunks) == 1:
            return batch_iter
        batches = list(itertools.islice(batch_iter, num_microbatches))
        return [iter(batches) for _ in self.chunks]

    def _run_schedule(self, batch_iter, num_microbatches: int, forward_only: bool) -> float:
        results = get_forward_backward_func()(
            forward_step_func=partial(_forward_step, self.device),
            data_iterator=self._schedule_input(batch_iter, num_microbatches),
            model=self.chunks,
            num_microbatches=num_microbatches,
            seq_length=self.cfg.model.seq_length,
            micro_batch_size=self.cfg.training.micro_batch_size,
            forward_only=forward_only,
        )
        return _reduce_loss(results)

    def train_step(self, batch_iter: Iterator[dict]) -> tuple[float, float, float]:
        """One optimizer step over the current global batch (megatron-core's
        ``get_current_global_batch_size()``, which grows during a ramp-up); the schedule steps
        by that many samples, unless fp16 loss scaling skipped the update on an overflow (as in
        Megatron-LM). Returns (loss, grad norm, learning rate used); with
        ``--log-num-zeros-in-grad`` the step's count of zero gradient entries (megatron-core's
        ``optimizer.step()``, over all ranks) is left in ``self.num_zeros_in_grad``, and an MoE
        model's router auxiliary losses of the step ({name: value},
        :meth:`.moe_metrics.MoeAuxLosses.collect`; empty for a dense model or a router that
        records none) in ``self.moe_aux_losses``."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        num_microbatches = get_num_microbatches()
        if self.moe_losses is not None:
            self.moe_losses.start()
        loss = self._run_schedule(batch_iter, num_microbatches, forward_only=False)
        if self.moe_losses is not None:
            iteration = self.state.iteration + 1
            self.moe_aux_losses = self.moe_losses.collect(iteration, num_microbatches)
        updated, grad_norm, self.num_zeros_in_grad = self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        if updated:
            self.scheduler.step(increment=get_current_global_batch_size())
        return loss, float(grad_norm or 0.0), lr

    @torch.no_grad()
    def forward_only(
        self, batch_iter: Iterator[dict], num_microbatches: Optional[int] = None
    ) -> float:
        """One forward-only pass of megatron-core's pipeline schedule, in eval mode.

        Shared by evaluation and the diagnostics (which wrap it in their activation hooks).
        Collective: every rank calls it with its own data-parallel batches.

        Args:
            batch_iter: this rank's micro-batches (dicts of tokens, labels, loss_mask,
                position_ids; (micro_batch_size, seq_length) int64/float tensors); the pass
                consumes ``num_microbatches`` of them.
            num_microbatches: micro-batches in the pass (default: a global batch's,
                megatron-core's ``get_num_microbatches()``).

        Returns:
            The mean LM loss over the micro-batches and data-parallel ranks, on every rank.
        """
        n = get_num_microbatches() if num_microbatches is None else num_microbatches
        for chunk in self.chunks:
            chunk.eval()
        try:
            return self._run_schedule(batch_iter, n, forward_only=True)
        finally:
            for chunk in self.chunks:
                chunk.train()

    def evaluate(self) -> float | None:
        """Mean loss over ``eval_iters`` full global batches of the validation split (also
        during a batch-size ramp-up, as Megatron-LM); None without a validation split or with
        ``eval_iters`` 0 (Megatron-LM's way to turn evaluation off)."""
        valid = self.datasets[1]
        if valid is None or len(valid) == 0 or self.cfg.training.eval_iters == 0:
            return None
        batches = self._iterator(valid, 0)
        t = self.cfg.training
        n = t.global_batch_size // (t.micro_batch_size * self.dp_size)
        losses = [self.forward_only(batches, n) for _ in range(t.eval_iters)]
        return sum(losses) / len(losses)

    def save(self) -> str:
        """Checkpoint under ``checkpoint.save`` (with ``--no-save-optim`` and retention)."""
        ck = self.cfg.checkpoint
        self.sync_params()
        return save_checkpoint(
            ck.save,
            self.chunks,
            self.optimizer,
            self.scheduler,
            self.state,
            save_optim=ck.save_optim,
            retain_last=ck.save_retain_last,
            retain_interval=ck.save_retain_interval,
            description=describe(self.cfg, fingerprint(self.tokenizer)),
        )

    def fire(self, hook: str, *args) -> None:
        """Call ``hook`` (a :class:`~.callback.Callback` method name) on every callback, in
        order."""
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def request_stop(self) -> None:
        """End the loop after the current round of ``on_step_end`` hooks."""
        self._stop = True

    def train(self) -> TrainResult:
        """Run from the current state to ``train_iters`` (or ``exit_interval``): the loop, plus
        the callbacks' hooks (contract: :mod:`megatron_gamma.training.callback`). SIGUSR1 and
        SIGTERM stop it with a checkpoint only when a preemption callback is among
        ``self.callbacks``; otherwise they act as they did before the trainer was built (see
        :class:`Trainer`)."""
        t = self.cfg.training
        self.end_iteration = min(t.train_iters, t.exit_interval or t.train_iters)
        self.result, self._stop = TrainResult(), False
        if any(
            isinstance(c, PreemptionCallback) and c.guard is self.preemption for c in self.callbacks
        ):
            self.preemption.install()
        else:
            self.preemption.release(resend=True)  # nothing would act on what it recorded
        self.log = self._open_log()
        self.fire("on_train_start")
        batches = self._iterator(self.datasets[0], self.state.consumed_samples)
        while self.state.iteration < self.end_iteration and not self._stop:
            start = time.time()
            update_num_microbatches(self.state.consumed_samples, consistency_check=True)
            loss, grad_norm, lr = self.train_step(batches)
            if t.check_for_nan_in_loss_and_grad:
                check_finite(self.state.iteration + 1, loss, grad_norm)
            self.preemption.arm()  # from here a SIGTERM waits for a save at the iteration's end
            self.state.iteration += 1
            batch = get_current_global_batch_size()
            self.state.consumed_samples += batch
            self.state.consumed_tokens += batch * self.cfg.model.seq_length
            it = self.state.iteration
            self.result.train_losses[it] = loss
            self.fire("on_step_end", StepOutput(it, loss, grad_norm, lr, time.time() - start))
        self.result.iteration = self.state.iteration
        self.sync_params()
        self.fire("on_train_end")
        self.log.close()
        return self.result

    def _open_log(self) -> MetricsLogger:
        """The run's logger (rank 0 writes ``metrics.jsonl``, TensorBoard and, with
        ``--wandb-project``, W&B through the run :func:`~.telemetry.start_wandb` started);
        names the run directory, says that a run without ``--save`` writes no checkpoint, notes a
        resume, and the iterations to train and how often a line comes (a log without a
        terminal has no progress bar, and is silent until the first ``--log-interval``)."""
        lg = self.cfg.logging
        log = MetricsLogger(
            lg.run_dir,
            lg.tensorboard_path(),
            active=self.rank == 0,
            total_iters=self.end_iteration,
            start_iter=self.state.iteration,
            progress_bar=lg.progress_bar,
            tensorboard_log_interval=lg.tensorboard_log_interval,
            validation_ppl_to_tensorboard=lg.log_validation_ppl_to_tensorboard,
            mirror=self.wandb,
        )
        log.message(
            f"run directory {lg.run_dir}: {CONFIG}, {METRICS}; TensorBoard events in "
            f"{lg.tensorboard_path()}"
        )
        if self.cfg.checkpoint.save is None:  # said here too: start-up warnings scroll away
            log.message(
                "no checkpoint will be written (no --save): to keep this run's weights, stop "
                "it now and start it again with --save DIR"
            )
        if self.state.iteration:
            log.message(f"resumed at iteration {self.state.iteration}")
        if self.state.iteration < self.end_iteration:
            log.message(
                f"training iterations {self.state.iteration + 1} to {self.end_iteration}: a "
                + (
                    "line every iteration"
                    if lg.log_interval == 1
                    else f"line every {lg.log_interval} iterations and at the last"
                )
            )
        return log

    def close(self) -> None:
        """Give SIGUSR1 and SIGTERM back to the handlers they had before the trainer was built
        (:meth:`~.preemption.PreemptionGuard.release`), release the ``--save`` and run-directory
        locks, megatron-core globals and the process group: those of them it took, also when
        its construction raised (then :meth:`__init__` calls this before re-raising)."""
        self.preemption.release()
        release_lock(self.save_lock)
        release_lock(self.run_lock)
        if self._parallel:
            destroy_num_microbatches_calculator()
            parallel.destroy()


def run_callbacks(cfg: Config, guard: PreemptionGuard) -> list[Callback]:
    """The run's callbacks, in the order :func:`pretrain` fires them.

    1. metrics (every step's scalars and the interval summary);
    2. evaluation (``--eval-interval``), before checkpointing, so that a checkpoint follows the
       validation of its iteration;
    3. checkpointing (``--save``, ``--save-interval``);
    4. diagnostics (``--log-diagnostics-interval`` > 0), after the checkpoint of the same
       iteration: the checkpoint is on disk before the probes run;
    5. the profiler (``--profile``) and manual garbage collection (``--manual-gc``), which
       depend on no other callback's work;
    6. preemption last: a stop request saves only when the checkpoint callback has not just
       saved that iteration.

    Args:
        cfg: the trainer's (reconciled) config, ``trainer.cfg``.
        guard: the trainer's :class:`~.preemption.PreemptionGuard`, ``trainer.preemption``.
    """
    callbacks: list[Callback] = [
        MetricsCallback(cfg),
        EvaluationCallback(cfg.training.eval_interval),
        CheckpointCallback(cfg.checkpoint.save, cfg.checkpoint.save_interval),
    ]
    if cfg.logging.log_diagnostics_interval:
        callbacks.append(DiagnosticsCallback(cfg.logging.log_diagnostics_interval))
    if cfg.logging.profile:
        callbacks.append(ProfilerCallback(cfg))
    if cfg.training.manual_gc:
        t = cfg.training
        callbacks.append(ManualGCCallback(t.manual_gc_interval, t.manual_gc_eval))
    callbacks.append(PreemptionCallback(guard))
    return callbacks


def pretrain(cfg: Config) -> TrainResult:
    """Build, train with :func:`run_callbacks`, checkpoint, tear down. See :class:`Trainer`."""
    trainer = Trainer(cfg)
    trainer.callbacks = run_callbacks(trainer.cfg, trainer.preemption)
    try:
        return trainer.train()
    finally:
        trainer.close()

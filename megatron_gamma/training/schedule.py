"""The learning-rate and weight-decay schedule, and what happens to it on resume.

The schedule is megatron-core's ``OptimizerParamScheduler``; its arguments come from the config
(:func:`scheduler_args`). A checkpoint stores the schedule it was trained with. On resume a
schedule that differs from the checkpoint's is an error listing each difference, as in
Megatron-LM, unless ``--override-opt-param-scheduler`` (train on with the config's schedule from
the checkpoint's iteration) or ``--use-checkpoint-opt-param-scheduler`` (keep the checkpoint's
schedule; the config is rewritten to it so that ``config.yaml`` records what is in effect).
"""

from __future__ import annotations

import dataclasses

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_gamma.config import Config, ConfigError

# OptimizerParamScheduler state key -> the config key a user sets for it.
_CONFIG_KEY = {
    "max_lr": "lr",
    "min_lr": "min_lr",
    "lr_warmup_steps": "lr_warmup_iters",
    "lr_decay_steps": "lr_decay_iters (default train_iters)",
    "lr_decay_style": "lr_decay_style",
    "start_wd": "weight_decay",
    "end_wd": "weight_decay",
    "wd_incr_style": "weight decay style",
    "wd_incr_steps": "train_iters (weight decay schedule)",
}


def scheduler_args(cfg: Config) -> dict:
    """Keyword arguments of megatron-core's ``OptimizerParamScheduler`` (besides the optimizer
    and the resume policy) for ``cfg``: linear warmup from 0 over ``lr_warmup_iters``, then
    ``lr_decay_style`` decay to ``min_lr`` over ``lr_decay_iters`` (default ``train_iters``);
    constant weight decay. Every key is also a key of the scheduler's ``state_dict()``."""
    o, t = cfg.optimizer, cfg.training
    decay = o.lr_decay_iters or t.train_iters
    return dict(
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=o.lr_warmup_iters,
        lr_decay_steps=max(decay, o.lr_warmup_iters + 1),
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=t.train_iters,
        wd_incr_style="constant",
    )


def build_scheduler(optimizer, cfg: Config) -> OptimizerParamScheduler:
    """megatron-core's scheduler for ``cfg``; on load it takes the config's values when
    ``override_opt_param_scheduler`` is set, else the checkpoint's (which
    :func:`reconcile_schedule` has already made equal to the config's)."""
    o = cfg.optimizer
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if o.lr_warmup_iters else o.lr,
        **scheduler_args(cfg),
        override_opt_param_scheduler=o.override_opt_param_scheduler,
        use_checkpoint_opt_param_scheduler=not o.override_opt_param_scheduler,
    )


def schedule_differences(cfg: Config, saved: dict) -> list[str]:
    """'key: checkpoint X, config Y' for each schedule value of ``cfg`` that differs from the
    checkpoint's scheduler state ``saved``. The weight-decay step count matters only for a
    non-constant weight-decay style."""
    mine = scheduler_args(cfg)
    out = []
    for key, value in mine.items():
        if key == "wd_incr_steps" and mine["wd_incr_style"] == "constant":
            continue
        if key in saved and saved[key] != value:
            out.append(f"{_CONFIG_KEY[key]}: checkpoint {saved[key]!r}, config {value!r}")
    return list(dict.fromkeys(out))  # start_wd and end_wd are both weight_decay


def reconcile_schedule(cfg: Config, saved: dict | None, path: str) -> Config:
    """The config to train with when resuming from a checkpoint whose scheduler state is
    ``saved`` (None: no checkpoint, ``cfg`` unchanged).

    Returns:
        ``cfg`` itself, or with ``--use-checkpoint-opt-param-scheduler`` a copy whose lr,
        min_lr, lr_warmup_iters, lr_decay_iters, lr_decay_style and weight_decay are the
        checkpoint's.

    Raises:
        ConfigError: the schedules differ and neither resume flag is given (the message lists
            each difference), or both flags are given.
    """
    o = cfg.optimizer
    if o.override_opt_param_scheduler and o.use_checkpoint_opt_param_scheduler:
        raise ConfigError(
            "override_opt_param_scheduler=True: excludes use_checkpoint_opt_param_scheduler=True. "
            "Fix: give one of --override-opt-param-scheduler (the config's schedule) or "
            "--use-checkpoint-opt-param-scheduler (the checkpoint's)"
        )
    if saved is None:
        return cfg
    differences = schedule_differences(cfg, saved)
    if not differences or o.override_opt_param_scheduler:
        return cfg
    if not o.use_checkpoint_opt_param_scheduler:
        raise ConfigError(
            f"load={path!r}: the configured learning-rate schedule differs from the "
            f"checkpoint's: {'; '.join(differences)}. Fix: restore these values, or add "
            "--override-opt-param-scheduler to train on with the config's schedule, or "
            "--use-checkpoint-opt-param-scheduler to keep the checkpoint's"
        )
    optimizer = dataclasses.replace(
        o,
        lr=saved["max_lr"],
        min_lr=saved["min_lr"],
        lr_warmup_iters=saved["lr_warmup_steps"],
        lr_decay_iters=saved["lr_decay_steps"],
        lr_decay_style=saved["lr_decay_style"],
        weight_decay=saved["start_wd"],
    )
    return dataclasses.replace(cfg, optimizer=optimizer)

"""The learning-rate and weight-decay schedule, and what happens to it on resume.

The schedule is megatron-core's ``OptimizerParamScheduler`` with Megatron-LM's arguments
(``megatron/training/training.py`` ``get_optimizer_param_scheduler``), counted in samples: each
iteration steps it by the global batch size in effect (which grows during a batch-size ramp-up),
iteration-based lengths are ``iters x global_batch_size`` and sample-based ones are used as
given. A checkpoint stores the schedule it was trained with. On resume a schedule that differs
from the checkpoint's is an error listing each difference, as in Megatron-LM, unless
``--override-opt-param-scheduler`` (train on with the config's schedule from the checkpoint's
step) or ``--use-checkpoint-opt-param-scheduler`` (keep the checkpoint's schedule; the config is
rewritten to it so that ``config.yaml`` records what is in effect).
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_gamma.config import Config, ConfigError
from megatron_gamma.config.schedule import trained_samples

# Scheduler state key -> the config key a user sets for it.
_CONFIG_KEY = {
    "max_lr": "lr",
    "min_lr": "min_lr",
    "init_lr": "lr_warmup_init",
    "lr_warmup_steps": "warmup samples (lr_warmup_iters x global_batch_size, lr_warmup_samples "
    "or lr_warmup_fraction x decay samples)",
    "lr_decay_steps": "decay samples (lr_decay_iters or train_iters, x global_batch_size; or "
    "lr_decay_samples or train_samples; at least warmup samples + 1, which megatron-core "
    "requires)",
    "lr_decay_style": "lr_decay_style",
    "wsd_decay_steps": "WSD annealing samples (lr_wsd_decay_iters x global_batch_size or "
    "lr_wsd_decay_samples)",
    "lr_wsd_decay_style": "lr_wsd_decay_style",
    "start_wd": "weight_decay / start_weight_decay",
    "end_wd": "weight_decay / end_weight_decay",
    "wd_incr_style": "weight_decay_incr_style",
    "wd_incr_steps": "weight decay samples (train_iters x global_batch_size or train_samples)",
}
# Keys megatron-core's state_dict() lacks; GammaParamScheduler stores them too.
_EXTRA_KEYS = ("init_lr", "wsd_decay_steps", "lr_wsd_decay_style")
# Checkpoints written before the schedule counted samples counted iterations.
_UNIT_KEY = "steps_unit"
_STEP_KEYS = ("lr_warmup_steps", "lr_decay_steps", "wd_incr_steps", "num_steps")


def scheduler_args(cfg: Config) -> dict:
    """Keyword arguments of megatron-core's ``OptimizerParamScheduler`` (besides the optimizer
    and the resume policy) for ``cfg``, in samples, as Megatron-LM's
    ``get_optimizer_param_scheduler``: warmup from ``lr_warmup_init`` over the warmup, then
    ``lr_decay_style`` to ``min_lr`` by the end of the decay span; weight decay from start to
    end over training (constant ``weight_decay`` by default)."""
    o, t = cfg.optimizer, cfg.training
    if t.train_samples is None:
        gbs = t.global_batch_size
        decay = (o.lr_decay_iters or t.train_iters) * gbs
        warmup = o.lr_warmup_iters * gbs
        wsd = o.lr_wsd_decay_iters * gbs if o.lr_wsd_decay_iters is not None else None
        wd_steps = t.train_iters * gbs
    else:
        decay = o.lr_decay_samples or t.train_samples
        warmup = o.lr_warmup_samples
        wsd = o.lr_wsd_decay_samples
        wd_steps = t.train_samples
    if o.lr_warmup_fraction is not None:
        warmup = o.lr_warmup_fraction * decay
    constant_wd = o.weight_decay_incr_style == "constant"
    return dict(
        init_lr=o.lr_warmup_init,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=max(decay, warmup + 1),  # megatron-core asserts warmup < decay
        lr_decay_style=o.lr_decay_style,
        wsd_decay_steps=wsd,
        lr_wsd_decay_style=o.lr_wsd_decay_style,
        start_wd=o.weight_decay if constant_wd else o.start_weight_decay,
        end_wd=o.weight_decay if constant_wd else o.end_weight_decay,
        wd_incr_steps=wd_steps,
        wd_incr_style=o.weight_decay_incr_style,
    )


def warmup_warning(cfg: Config) -> str | None:
    """The warning for a learning-rate warmup that outlasts training, or None.

    megatron-core's ``OptimizerParamScheduler`` raises the learning rate linearly from
    ``lr_warmup_init`` to ``lr`` over the warmup samples, and is stepped after each iteration by
    the samples it trained, so iteration ``i`` trains at the rate of the samples consumed before
    it. When the last iteration starts before the warmup ends (warmup > samples -
    global_batch_size, samples as :func:`~megatron_gamma.config.schedule.trained_samples` counts
    them, a batch-size ramp-up included), no iteration trains at ``lr`` and the decay never
    starts; the last trains at ``lr_warmup_init + (lr - lr_warmup_init) x (samples -
    global_batch_size) / warmup``.
    """
    o, t = cfg.optimizer, cfg.training
    warmup = scheduler_args(cfg)["lr_warmup_steps"]
    samples = trained_samples(t)
    last_start = max(samples - t.global_batch_size, 0)
    if not warmup or warmup <= last_start:
        return None
    last = o.lr_warmup_init + (o.lr - o.lr_warmup_init) * last_start / warmup
    return (
        f"the learning-rate warmup ({warmup:g} samples) outlasts training ({samples} samples): "
        f"no iteration trains at lr={o.lr:g} (the last trains at {last:.3g}) and the "
        f"{o.lr_decay_style} decay never starts. Fix: shorten the warmup (--lr-warmup-iters, "
        "--lr-warmup-samples or --lr-warmup-fraction) or train longer"
    )


def in_samples(saved: dict, global_batch_size: int) -> dict:
    """A checkpoint's scheduler state with its step counts in samples: states saved before the
    schedule counted samples (no ``steps_unit`` key) counted iterations, which are multiplied
    by ``global_batch_size`` (those runs had no ramp-up; a global batch size changed since is not
    detected)."""
    if _UNIT_KEY in saved:
        return saved
    out = dict(saved)
    for key in _STEP_KEYS:
        if key in out:
            out[key] = out[key] * global_batch_size
    return out


class GammaParamScheduler(OptimizerParamScheduler):
    """megatron-core's ``OptimizerParamScheduler`` whose state also holds ``init_lr``,
    ``wsd_decay_steps`` and ``lr_wsd_decay_style`` (megatron-core saves none of them) and the
    unit of its step counts, restored with megatron-core's override / use-checkpoint rule."""

    def __init__(self, optimizer, global_batch_size: int, **kwargs):
        self.global_batch_size = global_batch_size
        super().__init__(optimizer, **kwargs)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({key: getattr(self, key) for key in _EXTRA_KEYS})
        state[_UNIT_KEY] = "samples"
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = in_samples(state_dict, self.global_batch_size)
        for key in _EXTRA_KEYS:
            if key in state:
                setattr(self, key, self._check_and_set(getattr(self, key), state[key], key))
        super().load_state_dict(state)


def build_scheduler(optimizer, cfg: Config) -> GammaParamScheduler:
    """The scheduler for ``cfg``; on load it takes the config's values when
    ``override_opt_param_scheduler`` is set, else the checkpoint's (which
    :func:`reconcile_schedule` has already made equal to the config's)."""
    o = cfg.optimizer
    return GammaParamScheduler(
        optimizer,
        cfg.training.global_batch_size,
        **scheduler_args(cfg),
        override_opt_param_scheduler=o.override_opt_param_scheduler,
        use_checkpoint_opt_param_scheduler=not o.override_opt_param_scheduler,
    )


def schedule_differences(cfg: Config, saved: dict) -> list[str]:
    """'key: checkpoint X, config Y' for each schedule value of ``cfg`` that differs from the
    checkpoint's scheduler state ``saved`` (lengths in samples). The weight-decay step count
    matters only for a non-constant weight-decay style, the WSD values only for WSD, and the
    warmup start only with a warmup."""
    mine = scheduler_args(cfg)
    saved = in_samples(saved, cfg.training.global_batch_size)
    skip = set()
    if mine["wd_incr_style"] == "constant" and saved.get("wd_incr_style") == "constant":
        skip.add("wd_incr_steps")
    if mine["lr_decay_style"] != "WSD" and saved.get("lr_decay_style") != "WSD":
        skip |= {"wsd_decay_steps", "lr_wsd_decay_style"}
    if not mine["lr_warmup_steps"] and not saved.get("lr_warmup_steps"):
        skip.add("init_lr")
    out = []
    for key, value in mine.items():
        if key not in skip and key in saved and saved[key] != value:
            out.append(f"{_CONFIG_KEY[key]}: checkpoint {saved[key]!r}, config {value!r}")
    return out


def _checkpoint_schedule(cfg: Config, saved: dict) -> dict:
    """The optimizer fields (name -> value) that set the checkpoint's schedule ``saved`` (in
    samples), in the units the config trains in."""
    o, t = cfg.optimizer, cfg.training
    gbs = t.global_batch_size
    warmup, decay, wsd = (
        saved["lr_warmup_steps"],
        saved["lr_decay_steps"],
        saved.get("wsd_decay_steps"),
    )
    values = dict(
        lr=saved["max_lr"],
        min_lr=saved["min_lr"],
        lr_decay_style=saved["lr_decay_style"],
        lr_warmup_init=saved.get("init_lr", o.lr_warmup_init),
        lr_wsd_decay_style=saved.get("lr_wsd_decay_style") or o.lr_wsd_decay_style,
        weight_decay_incr_style=saved["wd_incr_style"],
        lr_warmup_fraction=None,
    )
    if saved["wd_incr_style"] == "constant":
        values.update(
            weight_decay=saved["start_wd"], start_weight_decay=None, end_weight_decay=None
        )
    else:
        values.update(start_weight_decay=saved["start_wd"], end_weight_decay=saved["end_wd"])
    if t.train_samples is not None:
        values.update(lr_warmup_samples=int(warmup), lr_decay_samples=int(decay))
        values.update(lr_wsd_decay_samples=wsd)
    elif warmup % gbs or decay % gbs or (wsd or 0) % gbs:
        values.update(
            lr_warmup_iters=0,
            lr_warmup_fraction=warmup / decay,
            lr_decay_iters=max(1, round(decay / gbs)),
            lr_wsd_decay_iters=None if wsd is None else max(1, round(wsd / gbs)),
        )
    else:
        values.update(
            lr_warmup_iters=int(warmup // gbs),
            lr_decay_iters=int(decay // gbs),
            lr_wsd_decay_iters=None if wsd is None else int(wsd // gbs),
        )
    return values


def reconcile_schedule(
    cfg: Config,
    saved: dict | None,
    path: str,
    model_changes: Sequence[str] = (),
    batch_changes: Sequence[str] = (),
) -> Config:
    """The config to train with when resuming from a checkpoint whose scheduler state is
    ``saved`` (None: no checkpoint, ``cfg`` unchanged).

    ``model_changes`` are the model settings that differ from the checkpoint's run
    (:func:`~megatron_gamma.rundir.layout.section_changes`): a refusal names them too, so that
    a resume with another model shape and another schedule (``--hidden-size`` and
    ``--train-iters`` both changed) is not first sent to fix the schedule alone.
    ``batch_changes`` (``global_batch_size=16 (the run had 8)``) likewise: a schedule counted
    in samples differs when only the batch size changed, which the refusal then says.

    Returns:
        ``cfg`` itself, or with ``--use-checkpoint-opt-param-scheduler`` a copy whose schedule
        (lr, min_lr, warmup start and length, decay length and style, WSD annealing, weight
        decay and its style) is the checkpoint's.

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
        also = restore = ""
        if model_changes:
            also = (
                f" The model settings differ from the checkpoint's run as well: "
                f"{', '.join(model_changes)}; a resume loads the run's tensors, so a setting "
                "that changes their shapes is refused next, once the model is built."
            )
            restore = "give the run's model settings where they change shapes (its config.yaml); "
        if batch_changes:
            also += (
                f" {', '.join(batch_changes)}: the schedule counts samples, so its lengths in "
                "iterations (--train-iters, --lr-decay-iters, --lr-warmup-iters) are that many "
                "batches of this size."
            )
        raise ConfigError(
            f"load={path!r}: the configured learning-rate schedule differs from the "
            f"checkpoint's: {'; '.join(differences)}.{also} Fix: {restore}restore the "
            "schedule's values, or add --override-opt-param-scheduler to train on with the "
            "config's schedule, or --use-checkpoint-opt-param-scheduler to keep the "
            "checkpoint's"
        )
    saved = in_samples(saved, cfg.training.global_batch_size)
    return cfg.replace(**_checkpoint_schedule(cfg, saved))

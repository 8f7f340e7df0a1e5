"""Schedule arithmetic of sample-based and iteration-based training: iterations from samples
(through a batch-size ramp-up), the samples a run consumes, and Megatron-LM's rule that each
schedule length is given in one unit (:data:`UNIT_ALTERNATIVES`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from megatron_gamma.config.errors import fail

if TYPE_CHECKING:
    from megatron_gamma.config.loading import Config
    from megatron_gamma.config.sections import TrainingConfig


def rampup_train_iters(
    train_samples: int, global_batch_size: int, rampup_batch_size: Optional[list]
) -> int:
    """Iterations of sample-based training, Megatron-LM's ``update_train_iters``: without
    ramp-up ``train_samples // global_batch_size``; with it, the iterations of the ramp (while
    the consumed samples are <= its SAMPLES, each at megatron-core's
    RampupBatchsizeNumMicroBatchesCalculator size) plus whole global batches of the rest (a
    partial last batch is dropped)."""
    return _sample_schedule(train_samples, global_batch_size, rampup_batch_size)[0]


def trained_samples(t: TrainingConfig) -> int:
    """Samples the run consumes over ``t.train_iters`` iterations: ``train_iters x
    global_batch_size``, or with ``rampup_batch_size`` the ramp's smaller batches first (as
    :func:`rampup_train_iters` counts them)."""
    if t.rampup_batch_size is None:
        return t.train_iters * t.global_batch_size
    return _sample_schedule(t.train_samples, t.global_batch_size, t.rampup_batch_size)[1]


def _sample_schedule(
    train_samples: int, global_batch_size: int, rampup_batch_size: Optional[list]
) -> tuple[int, int]:
    """(iterations, samples consumed) of sample-based training (see rampup_train_iters)."""
    if rampup_batch_size is None:
        iterations = train_samples // global_batch_size
        return iterations, iterations * global_batch_size
    from megatron.core.num_microbatches_calculator import (
        RampupBatchsizeNumMicroBatchesCalculator,
    )

    start, incr, samples = rampup_batch_size
    calc = RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size, 1, 1, False, -1, start, incr, samples
    )
    iterations = consumed = 0
    while consumed <= samples:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    rest = (train_samples - consumed) // global_batch_size
    return iterations + rest, consumed + rest * global_batch_size


UNIT_ALTERNATIVES = (
    ("train_iters", "train_samples"),
    ("lr_decay_iters", "lr_decay_samples"),
    ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction"),
    ("lr_wsd_decay_iters", "lr_wsd_decay_samples"),
)


def check_schedule_units(cfg: Config) -> None:
    """Megatron-LM's exclusions between iteration-based and sample-based training (validation
    of the whole config: the lengths live in two sections).

    Raises:
        ConfigError: with train_samples, any of lr_decay_iters, lr_warmup_iters,
            lr_wsd_decay_iters; without it, any of lr_decay_samples, lr_warmup_samples,
            lr_wsd_decay_samples (each named, with the matching flag to use).
    """
    o, samples = cfg.optimizer, cfg.training.train_samples is not None
    for iters_key, samples_key, *_ in UNIT_ALTERNATIVES[1:]:
        wrong, right = (iters_key, samples_key) if samples else (samples_key, iters_key)
        if getattr(o, wrong):
            kind = "sample-based (train_samples)" if samples else "iteration-based (train_iters)"
            fail(
                wrong,
                getattr(o, wrong),
                f"training is {kind}, as in Megatron-LM each schedule length must be given the "
                "same way",
                f"use --{right.replace('_', '-')} instead",
            )


def drop_alternatives(raw: dict, layer: dict) -> None:
    """Before ``layer`` ({section: {key: value}}) is laid over ``raw``: a key of
    :data:`UNIT_ALTERNATIVES` that the layer sets to a value (not None, and none of its
    alternatives) drops those alternatives from ``raw``, so that e.g. ``--train-samples`` or
    ``--lr-warmup-fraction`` on the command line replaces a recipe's ``train_iters`` or
    ``lr_warmup_iters`` instead of clashing with it, while unsetting one
    (``cfg.replace(train_samples=None)``) keeps the others."""
    given = {k for values in layer.values() for k, v in (values or {}).items() if v is not None}
    for group in UNIT_ALTERNATIVES:
        chosen = [key for key in group if key in given]
        if len(chosen) == 1:
            for values in raw.values():
                for other in group:
                    if other != chosen[0]:
                        values.pop(other, None)

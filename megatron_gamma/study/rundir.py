"""Reading a finished or running run directory: the one place the study knows the metric names
that ``pretrain`` writes (the files themselves are read by :mod:`megatron_gamma.rundir`).

Layout (written by :mod:`megatron_gamma.training`): ``RUN/metrics.jsonl`` (one JSON object per
record, ``"split"``: ``train`` | ``valid`` | ``diagnostics``; after a resume, iterations past the
last checkpoint appear twice and the later record wins), ``RUN/checkpoints/`` with megatron-core's
``latest_checkpointed_iteration.txt``, ``RUN/config.yaml``. Diagnostic keys
(:func:`megatron_gamma.diagnostics.probes`): ``stable_rank/ROLE/layer_LL``,
``sink_share/layer_LL``, ``norm_saturated/NORM/layer_LL``, ``condensation/ROLE/layer_LL``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from megatron_gamma.rundir.layout import (
    CHECKPOINTS,
    METRICS,
    latest_iteration,
    read_metrics,
    resolve_checkpoint,
)

__all__ = [
    "CHECKPOINTS",
    "METRICS",
    "RunRecord",
    "is_finished",
    "latest_iteration",
    "read_run",
    "resolve_checkpoint",
]


@dataclass
class RunRecord:
    """What a run directory holds, keyed by iteration.

    Attributes:
        valid: {iteration: validation loss (nats)}.
        train: {iteration: training loss (nats)}.
        diagnostics: {iteration: {key: value}} from ``--log-diagnostics-interval``.
        checkpoint: newest complete checkpoint iteration, or None.
    """

    valid: dict[int, float] = field(default_factory=dict)
    train: dict[int, float] = field(default_factory=dict)
    diagnostics: dict[int, dict[str, float]] = field(default_factory=dict)
    checkpoint: Optional[int] = None

    def final_valid_loss(self) -> Optional[float]:
        """Validation loss at the last evaluated iteration, or None."""
        return self.valid[max(self.valid)] if self.valid else None

    def keys(self, prefix: str) -> set[str]:
        """The keys ``prefix/...`` that :meth:`series` averages, at any iteration (e.g.
        ``stable_rank/qkv.q/layer_00``)."""
        return {
            k
            for values in self.diagnostics.values()
            for k in values
            if k.startswith(prefix + "/") and _is_aggregate(prefix, k)
        }

    def non_finite(self, prefix: str, keys: Optional[set[str]] = None) -> list[int]:
        """The diagnostics iterations, sorted, where a key :meth:`series` would average (``keys``
        only, when given) is NaN or inf: a value :meth:`series` leaves out, so the mean there
        is over other matrices or layers than elsewhere."""
        return sorted(
            it
            for it, values in self.diagnostics.items()
            if any(
                not np.isfinite(v)
                for k, v in values.items()
                if k.startswith(prefix + "/")
                and _is_aggregate(prefix, k)
                and (keys is None or k in keys)
            )
        )

    def series(self, prefix: str, keys: Optional[set[str]] = None) -> dict[int, float]:
        """Per diagnostics iteration, the mean over every key ``prefix/...`` whose value is finite
        (e.g. ``stable_rank`` averages all matrices; ``sink_share`` all layers' means), only
        over ``keys`` when given (e.g. the matrices two arms both have)."""
        out = {}
        for it, values in sorted(self.diagnostics.items()):
            picked = [
                v
                for k, v in values.items()
                if k.startswith(prefix + "/")
                and np.isfinite(v)
                and _is_aggregate(prefix, k)
                and (keys is None or k in keys)
            ]
            if picked:
                out[it] = float(np.mean(picked))
        return out


def _is_aggregate(prefix: str, key: str) -> bool:
    """Per-layer keys only for ``sink_share`` (its ``/head_HH`` keys repeat the layer mean)."""
    return prefix != "sink_share" or "/head_" not in key


def read_run(run_dir: str) -> RunRecord:
    """Read ``RUN/metrics.jsonl`` (:func:`megatron_gamma.rundir.layout.read_metrics`: a torn
    last line is skipped with a warning) and the checkpoint tracker (a missing file gives empty
    fields).

    Raises:
        ValueError: a metrics line before the last that is not JSON (names file and line).
    """
    rec = RunRecord()
    for r in read_metrics(run_dir):
        it, split = int(r["iteration"]), r.get("split")
        if split == "valid":
            rec.valid[it] = float(r["loss"])
        elif split == "train":
            rec.train[it] = float(r["loss"])
        elif split == "diagnostics":
            rec.diagnostics[it] = {
                k: float(v)
                for k, v in r.items()
                if k not in ("iteration", "split") and isinstance(v, (int, float))
            }
    rec.checkpoint = latest_iteration(os.path.join(run_dir, CHECKPOINTS))
    return rec


def final_loss(run_dir: str, train_iters: int) -> Optional[float]:
    """Final validation loss of the run in ``run_dir`` if it saved its checkpoint at
    ``train_iters`` and validated there, else None."""
    rec = read_run(run_dir)
    if rec.checkpoint == train_iters and train_iters in rec.valid:
        return rec.valid[train_iters]
    return None


def is_finished(run_dir: str, train_iters: int) -> bool:
    """True when the run saved its checkpoint at ``train_iters`` and validated there."""
    return final_loss(run_dir, train_iters) is not None


def finished_loss(run) -> Optional[float]:
    """:func:`final_loss` of a :class:`~megatron_gamma.study.spec.Run`."""
    return final_loss(run.config.logging.run_dir, run.train_iters)

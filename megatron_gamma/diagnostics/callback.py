"""The live diagnostics hook of the training loop (``--log-diagnostics-interval N``).

At initialization (iteration 0, before the first step of a run that starts from scratch) and
every N iterations, :class:`DiagnosticsCallback`:

1. computes the weight diagnostics (stable rank, top-direction share, condensation score of every
   matrix) on this rank's tensor-parallel shards (:func:`~.probes.weight_diagnostics`);
2. runs the trainer's forward-only pass (``Trainer.forward_only``: megatron-core's pipeline
   schedule, eval mode) on the first validation micro-batch, with
   :class:`~.probes.ActivationProbe` hooks (attention-sink share per head, RMSNorm saturation
   per norm, gate statistics per gated layer);
3. gathers the per-stage results on global rank 0 and logs them to TensorBoard
   (``diagnostics/<key>``) and ``metrics.jsonl`` (``"split": "diagnostics"``), with the
   wall-clock seconds the diagnostics took (``diagnostics_seconds``).

Between diagnostics steps no hook is installed, so ordinary iterations cost nothing extra.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch.utils.data import Dataset

from megatron_gamma.data.datasets import micro_batches
from megatron_gamma.diagnostics.probes import (
    CONDENSATION_ROWS,
    ActivationProbe,
    aggregate_experts,
    parse_metric_key,
    weight_diagnostics,
)
from megatron_gamma.training.callback import Callback, StepOutput

if TYPE_CHECKING:
    from megatron_gamma.training.loop import Trainer


class DiagnosticsCallback(Callback):
    """Compute and log the paper's diagnostics every ``interval`` iterations.

    A :class:`~megatron_gamma.training.callback.Callback`: the trainer calls
    :meth:`on_step_end` once at the end of every iteration.

    Args:
        interval: iterations between diagnostics (>= 1).
        max_rows: rows sampled per matrix for the condensation score.

    Raises:
        ValueError: interval < 1.
    """

    def __init__(self, interval: int, max_rows: int = CONDENSATION_ROWS):
        if interval < 1:
            raise ValueError(f"interval={interval}: must be >= 1 (0 disables the callback)")
        self.interval = interval
        self.max_rows = max_rows
        self._warned = False

    def on_train_start(self, trainer: Trainer) -> None:
        """Log the diagnostics of the initialized model as iteration 0 (runs that start from
        scratch; a resumed run logged them when it started)."""
        if trainer.state.iteration == 0:
            self._log(trainer, 0)

    def on_step_end(self, trainer: Trainer, step: StepOutput) -> None:
        """Run the diagnostics when the step's iteration is a multiple of the interval."""
        if step.iteration % self.interval == 0:
            self._log(trainer, step.iteration)

    def _log(self, trainer: Trainer, iteration: int) -> None:
        start = time.time()
        values = self.collect(trainer)
        if values is not None:
            values["diagnostics_seconds"] = time.time() - start
            if trainer.log is not None:
                trainer.log.scalars(iteration, values, split="diagnostics")

    def collect(self, trainer: Trainer) -> dict[str, float] | None:
        """All diagnostics of the trainer's model now; the merged dict on global rank 0, None
        elsewhere. Collective over all ranks."""
        trainer.sync_params()
        models = [chunk.module for chunk in trainer.chunks]
        tp_group = parallel_state.get_tensor_model_parallel_group()
        values = weight_diagnostics(
            models,
            tp_group,
            expert_tp_group=parallel_state.get_expert_tensor_parallel_group(),
            max_rows=self.max_rows,
        )
        batch = self._validation_batch(trainer)
        if batch is not None:
            # megatron-core's interleaved (virtual-pipeline) schedule needs at least PP
            # micro-batches; the probe records only each module's first call, so repeating the
            # batch leaves the results those of one pass.
            n = parallel_state.get_pipeline_model_parallel_world_size() if len(models) > 1 else 1
            with ActivationProbe(models, tp_group) as probe:
                trainer.forward_only(iter([batch] * n), num_microbatches=n)
            values.update(probe.results())
        elif not self._warned and trainer.rank == 0 and trainer.log is not None:
            trainer.log.message("diagnostics: no validation data; activation diagnostics skipped")
            self._warned = True
        return _gather_on_rank0(values)

    @staticmethod
    def _validation_batch(trainer: Trainer):
        return first_validation_batch(
            trainer.datasets[1] if len(trainer.datasets) > 1 else None,
            trainer.cfg.training.micro_batch_size,
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_world_size(),
        )


def first_validation_batch(
    valid: Optional[Dataset], micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1
) -> Optional[dict[str, torch.Tensor]]:
    """The first validation micro-batch of data-parallel rank ``dp_rank``: the batch every
    validation pass of training starts with (``Trainer.evaluate`` reads the split through
    :func:`~megatron_gamma.data.datasets.micro_batches` from sample 0), used by the live
    diagnostics and by ``analyze``.

    Args:
        valid: the validation split (``build_datasets(cfg, tokenizer)[1]``), or None.
        micro_batch_size: sequences in the batch.
        dp_rank, dp_size: this rank's data-parallel slice (rank 0 of 1: samples 0 .. B-1).

    Returns:
        tokens, labels, loss_mask, position_ids, each (micro_batch_size, seq_length) (int64,
        int64, float32, int64), plus attention_mask (micro_batch_size, 1, seq_length,
        seq_length) bool under ``--reset-attention-mask``; None without validation data or
        with fewer than ``micro_batch_size`` samples for this rank.
    """
    if valid is None or len(valid) == 0:
        return None
    return next(micro_batches(valid, 0, micro_batch_size, dp_rank, dp_size), None)


def _gather_on_rank0(values: dict[str, float]) -> dict[str, float] | None:
    """Merge the results of every pipeline stage and expert-parallel rank on global rank 0, and
    add the per-layer means over experts (:func:`~.probes.aggregate_experts`).

    Dense keys come from TP rank 0, DP rank 0 of each stage (the others hold copies or other
    data-parallel batches); per-expert keys from expert-TP rank 0, expert-DP rank 0 (each
    expert-parallel rank holds different experts)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return aggregate_experts(values)
    dense = (
        parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_data_parallel_rank() == 0
    )
    expert = (
        parallel_state.get_expert_tensor_parallel_rank() == 0
        and parallel_state.get_expert_data_parallel_rank() == 0
    )
    mine = {
        k: v
        for k, v in values.items()
        if (expert if parse_metric_key(k)["expert"] is not None else dense)
    }
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, float] = {}
    for part in gathered:
        merged.update(part)
    return aggregate_experts(merged)

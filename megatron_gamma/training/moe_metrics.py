"""The MoE router's auxiliary losses of each training step, as Megatron-LM logs them.

megatron-core's router records each loss it adds, per layer and summed over a step's
micro-batches, in its logging tracker (``moe_utils.save_to_aux_losses_tracker``, divided by the
loss's coefficient, so the value does not depend on ``--moe-aux-loss-coeff`` or
``--moe-z-loss-coeff``); Megatron-LM's ``training_log`` turns it into one number per loss and
iteration with ``moe_utils.track_moe_metrics`` (scaled by 1 / micro-batches, averaged over the
MoE layers). :class:`MoeAuxLosses` does the same each step, in two steps around megatron-core:
the tracker's entries are made before the step on the model's device (what
``force_initialize=True`` does on ``"cuda"`` only), and their cross-rank reduction runs here
(:func:`_reduce_entry`, reasons there) before ``track_moe_metrics`` averages them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe.moe_utils import (
    get_moe_layer_wise_logging_tracker,
    track_moe_metrics,
)

from megatron_gamma.config import ModelConfig, moe_layer_pattern

LOAD_BALANCING_NAMES = {
    "aux_loss": "load_balancing_loss",
    "seq_aux_loss": "seq_load_balancing_loss",
    "global_aux_loss": "global_load_balancing_loss",
}
"""``--moe-router-load-balancing-type`` -> the name its router loss has in megatron-core's tracker
(``TopKRouter._apply_aux_loss``, ``_apply_seq_aux_loss``, ``_apply_global_aux_loss`` in
``megatron/core/transformer/moe/router.py``); sinkhorn and none record no loss."""

Z_LOSS_NAME = "z_loss"
"""The tracker's name of the router z-loss (``TopKRouter.apply_z_loss``), with
``--moe-z-loss-coeff``."""


def tracked_names(model: ModelConfig) -> list[str]:
    """The auxiliary losses a model's routers record in training, in megatron-core's names:
    the load-balancing loss of ``--moe-router-load-balancing-type`` (none for sinkhorn and
    none), then ``z_loss`` with ``--moe-z-loss-coeff``; empty for a dense model."""
    if model.num_experts is None:
        return []
    balancing = LOAD_BALANCING_NAMES.get(model.moe_router_load_balancing_type)
    names = [balancing] if balancing else []
    if model.moe_z_loss_coeff is not None:
        names.append(Z_LOSS_NAME)
    return names


def _mean(values: torch.Tensor, group) -> None:
    """All-reduce ``values`` in place to their mean over ``group``: a sum, then a division.
    ``ReduceOp.AVG``, which megatron-core uses, exists for gloo only from torch 2.8
    (pytorch#149781), and CPU runs are gloo on every supported torch (2.6 and up)."""
    dist.all_reduce(values, group=group)
    values /= dist.get_world_size(group)


def _reduce_entry(entry: dict) -> None:
    """One tracker entry reduced across ranks as megatron-core's
    ``moe_utils.reduce_aux_losses_tracker_across_ranks`` does it (a sum over its
    ``reduce_group``, then the mean over the data-parallel group unless that group holds it,
    the mean over its ``avg_group``, and a sum over the pipeline group, which carries each stage's
    layers to every stage), with two changes: means are a sum and a division (:func:`_mean`),
    and the pipeline sum comes last. Each stage reduces its own layers first, so a stage without
    MoE layers, whose entry names no group, receives reduced values; megatron-core sums over the
    pipeline first, which leaves such a stage (rank 0, which logs, under a ``--moe-layer-freq``
    that makes it dense) with one rank's unreduced values. All are sums and means over
    orthogonal groups, so the order changes nothing else."""
    values = entry["values"]
    if entry["reduce_group"] is not None:
        dist.all_reduce(values, group=entry["reduce_group"])
        if not entry["reduce_group_has_dp"]:
            dp = parallel_state.get_data_parallel_group(
                with_context_parallel=False, partial_data_parallel=False
            )
            _mean(values, dp)
    if entry["avg_group"] is not None:
        _mean(values, entry["avg_group"])
    dist.all_reduce(values, group=parallel_state.get_pipeline_model_parallel_group())


class MoeAuxLosses:
    """Each training step's router auxiliary losses, one float per name: :meth:`start` before
    the step's forward-backward passes, :meth:`collect` after (both on every rank:
    :meth:`collect` is collective).

    Args:
        names: the tracker's names to log (:func:`tracked_names`), not empty.
        model: the model's config (``num_layers``, ``moe_layer_freq``).
        device: where the model's layers run; the tracker's tensors go there.
    """

    def __init__(self, names: list[str], model: ModelConfig, device: torch.device):
        self.names = names
        self.num_layers = model.num_layers
        self.pattern = moe_layer_pattern(model.moe_layer_freq, model.num_layers)
        self.device = device

    def start(self) -> None:
        """Empty megatron-core's tracker and make one zeroed entry per name (float32 values of
        shape (num_layers,) on ``device``, one per global layer, with no reduce groups: the
        routers set theirs when they record), so that every rank holds the same names, as
        Megatron-LM's ``force_initialize`` does; an earlier model's entries (another layer
        count, groups since destroyed) and anything recorded outside the step go."""
        tracker = get_moe_layer_wise_logging_tracker()
        tracker.clear()
        for name in self.names:
            tracker[name] = {
                "values": torch.zeros(self.num_layers, device=self.device),
                "reduce_group": None,
                "avg_group": None,
                "reduce_group_has_dp": False,
            }

    def collect(self, iteration: int, num_microbatches: int) -> dict[str, float]:
        """The step's losses, reduced across ranks (:func:`_reduce_entry`), then scaled by
        1 / ``num_microbatches`` and averaged over the MoE layers by megatron-core's
        ``track_moe_metrics`` (Megatron-LM's ``loss_scale``), which empties the tracker.

        Args:
            iteration: the step's iteration (from 1).
            num_microbatches: the step's micro-batches per data-parallel rank.

        Returns:
            {name: value}: the mean of the loss over the MoE layers and the step's micro-batches,
            dimensionless, unscaled by its coefficient; load-balancing losses are also the mean
            over data-parallel ranks, ``z_loss`` is this rank's (megatron-core does not reduce
            it).
        """
        tracker = get_moe_layer_wise_logging_tracker()
        for name in self.names:
            _reduce_entry(tracker[name])
        totals: dict[str, torch.Tensor] = {}
        track_moe_metrics(
            loss_scale=1.0 / num_microbatches,
            iteration=iteration,
            total_loss_dict=totals,
            track_names=[],  # reduced above: track_moe_metrics reduces none of them again
            num_layers=self.num_layers,
            moe_layer_freq=self.pattern,
        )
        return {name: float(totals[name]) for name in self.names}

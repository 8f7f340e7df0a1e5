"""Global L2 norm of the model's parameters (Megatron-LM's ``--log-params-norm``).

Every distinct shard of every parameter is counted once over the whole world, whatever the
tensor / pipeline / expert / data-parallel layout: a rank adds a parameter's squares only when it
owns that shard (:func:`~megatron_gamma.training.init_audit.owns_shard`: data-parallel and
expert-data-parallel replicas and TP-replicated weights counted on one rank), and the output
layer's copy of a tied embedding on the last pipeline stage (megatron-core marks it ``shared``)
is skipped, as in Megatron-LM's ``calc_params_l2_norm``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from megatron_gamma.model.roles import role_of
from megatron_gamma.training.init_audit import owns_shard, shard_sums


@torch.no_grad()
def params_l2_norm(models: list) -> float:
    """sqrt(sum of squares) of all parameters of the global model, on every rank.

    Collective: every rank of the default process group must call it (one all-reduce of one
    float64). The squares are summed in float64 (:func:`~.init_audit.shard_sums`).

    Args:
        models: this rank's unwrapped GPTModel chunks.
    """
    total, device = 0.0, next(models[0].parameters()).device
    for model in models:
        for name, param in model.named_parameters():
            if getattr(param, "shared", False) or not owns_shard(role_of(name)):
                continue
            total += shard_sums(param)[1]
    value = torch.tensor([total], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(value)
    return math.sqrt(float(value))

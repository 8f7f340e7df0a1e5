"""RMSNorm for megatron-core layer specs, backed by :func:`megatron_gamma.ops.rms_norm`."""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_gamma import ops


class RMSNorm(torch.nn.Module):
    """Small-eps-safe RMSNorm with megatron-core's norm constructor signature.

    Unlike megatron-core's ``WrappedTorchNorm`` it supports sequence parallelism: the weight is
    tagged ``sequence_parallel`` so megatron-core all-reduces its gradient over the
    tensor-parallel group (``finalize_model_grads``).

    Args:
        config: the layer's TransformerConfig (``sequence_parallel``,
            ``layernorm_zero_centered_gamma``).
        hidden_size: normalized dimension.
        eps: epsilon added to the mean square (paper: 1e-12).
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-12, **_):
        super().__init__()
        self.eps = eps
        self.zero_centered_gamma = config.layernorm_zero_centered_gamma
        init = torch.zeros if self.zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (seq, batch, hidden) -> same shape and dtype."""
        return ops.rms_norm(x, self.weight, self.eps, self.zero_centered_gamma)

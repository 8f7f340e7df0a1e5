"""torch.library glue for the compiled kernels: fake (meta) kernels and autograd formulas.

The operator schemas and the CPU/CUDA kernels are registered in C++ (``csrc/``) when
``megatron_gamma._C`` is imported; this module adds what ``torch.compile`` and autograd need:

================================  ==========================================================
op                                outputs
================================  ==========================================================
``rms_norm_fwd(x, w, eps, zcg)``  y (x's shape and dtype), rstd (x.shape[:-1], fp32; fp64
                                  for fp64 x) = 1 / sqrt(mean(x^2) + eps)
``rms_norm_bwd(dy, x, w, rstd,    dx (x's shape and dtype), dw (w's shape and dtype, reduced
zcg)``                            over all rows in fp32)
``sigmoid_gate_fwd(o, g)``        y = o * sigmoid(g) (o's shape and dtype)
``sigmoid_gate_bwd(dy, o, g)``    do (o's shape), dg (g's shape)
================================  ==========================================================

Outputs are contiguous whatever the input strides. Importing raises ImportError (or OSError)
when the extension is not built or cannot be loaded; :mod:`megatron_gamma.ops` handles that.
"""

from __future__ import annotations

import torch

from megatron_gamma import _C

ops = torch.ops.megatron_gamma

#: Device types with compiled kernels in this build.
DEVICE_TYPES = frozenset({"cpu", "cuda"} if _C.with_cuda else {"cpu"})


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("megatron_gamma::rms_norm_fwd")
def _rms_norm_fwd_fake(x, weight, eps, zero_centered_gamma):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=_acc_dtype(x.dtype))


@torch.library.register_fake("megatron_gamma::rms_norm_bwd")
def _rms_norm_bwd_fake(dy, x, weight, rstd, zero_centered_gamma):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


@torch.library.register_fake("megatron_gamma::sigmoid_gate_fwd")
def _sigmoid_gate_fwd_fake(o, g):
    return o.new_empty(o.shape)


@torch.library.register_fake("megatron_gamma::sigmoid_gate_bwd")
def _sigmoid_gate_bwd_fake(dy, o, g):
    return o.new_empty(o.shape), g.new_empty(g.shape)


def _rms_norm_setup_context(ctx, inputs, output):
    x, weight, _, zero_centered_gamma = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.mark_non_differentiable(output[1])


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = ops.rms_norm_bwd(dy, x, weight, rstd, ctx.zero_centered_gamma)
    return dx, dweight, None, None


def _sigmoid_gate_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _sigmoid_gate_backward(ctx, dy):
    o, g = ctx.saved_tensors
    return ops.sigmoid_gate_bwd(dy, o, g)


torch.library.register_autograd(
    "megatron_gamma::rms_norm_fwd", _rms_norm_backward, setup_context=_rms_norm_setup_context
)
torch.library.register_autograd(
    "megatron_gamma::sigmoid_gate_fwd",
    _sigmoid_gate_backward,
    setup_context=_sigmoid_gate_setup_context,
)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool
) -> torch.Tensor:
    """The compiled RMSNorm; arguments as :func:`megatron_gamma.ops.rms_norm`."""
    return ops.rms_norm_fwd(x, weight, eps, zero_centered_gamma)[0]


def sigmoid_gate(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The compiled sigmoid gate; arguments as :func:`megatron_gamma.ops.sigmoid_gate`."""
    return ops.sigmoid_gate_fwd(o, g)

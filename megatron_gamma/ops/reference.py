"""Pure-torch reference kernels: the numerical contract every fused implementation follows.

RMSNorm (small-epsilon safe)
    y = x / sqrt(mean(x^2) + eps) * w           (per row: the last dimension, one token)

    computed as  x_hat = x / m,  y = x_hat / sqrt(mean(x_hat^2) + (sqrt(eps) / m)^2) * w
    with m = max(max|x|, sqrt(eps)) per row, in fp32 whatever the input dtype. The two forms are
    algebraically identical, so eps keeps its exact meaning (it is added to the mean square of the
    unscaled row, and never cast to the input dtype: 1e-12 is 0 in fp16). Scaling by m keeps every
    intermediate in [0, 1]: squares of tiny rows (|x| < 1e-19 underflows in fp32, anything below
    ~2e-4 in fp16) and of huge rows (|x| > 1.8e19 overflows fp32) never happen. An all-zero row
    gives m = sqrt(eps), denominator 1 and output 0 with finite gradients. ``m`` is treated as a
    constant in backward (y does not depend on it), so autograd yields the exact gradient.
    With ``zero_centered_gamma`` the stored weight is w - 1 (Transformer Engine's convention).

Sigmoid output gate (gated attention)
    y = o * sigmoid(g), sigmoid in fp32; g has o's shape (elementwise) or o's shape without the
    last (head_dim) dimension (headwise: one gate per head, broadcast over head_dim).
"""

from __future__ import annotations

import math

import torch


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False
) -> torch.Tensor:
    """Small-eps-safe RMSNorm over the last dimension.

    Args:
        x: (..., hidden) fp32, bf16 or fp16.
        weight: (hidden,) the gain w (or w - 1 when ``zero_centered_gamma``).
        eps: added to the mean square, kept in fp32 (paper: 1e-12).
        zero_centered_gamma: the weight stores w - 1.

    Returns:
        (..., hidden) in x's dtype.
    """
    xf = x.float()
    m = xf.abs().amax(dim=-1, keepdim=True).clamp_min(math.sqrt(eps)).detach()
    x_hat = xf / m
    denom = torch.sqrt(x_hat.square().mean(dim=-1, keepdim=True) + (math.sqrt(eps) / m).square())
    w = weight.float() + 1.0 if zero_centered_gamma else weight.float()
    return (x_hat / denom * w).to(x.dtype)


def sigmoid_gate_reference(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gated attention output y = o * sigmoid(g).

    Args:
        o: (..., heads, head_dim) attention output per head.
        g: (..., heads, head_dim) for an elementwise gate or (..., heads) for a headwise gate.

    Returns:
        y with o's shape and dtype.

    Raises:
        ValueError: g's shape is neither o's nor o's without the last dimension.
    """
    if g.shape == o.shape:
        gate = torch.sigmoid(g.float())
    elif g.shape == o.shape[:-1]:
        gate = torch.sigmoid(g.float()).unsqueeze(-1)
    else:
        raise ValueError(
            f"gate shape {tuple(g.shape)} fits neither o {tuple(o.shape)} (elementwise) nor "
            f"{tuple(o.shape[:-1])} (headwise)"
        )
    return (o.float() * gate).to(o.dtype)

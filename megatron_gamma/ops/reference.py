"""Pure-torch reference kernels: the numerical contract every fused implementation follows.

RMSNorm (small-epsilon safe; the paper's eps = 1e-12 regime)
    y = x / sqrt(mean(x^2) + eps) * w           (per row: the last dimension, one token)

    computed, in fp32 whatever the input dtype (fp64 for fp64 inputs), as::

        s     = 2^-e   where max(max|x|, sqrt(eps)) = f * 2^e, f in [0.5, 1)   (frexp)
        x_hat = x * s                                  (every |x_hat| < 1)
        y     = x_hat / sqrt(mean(x_hat^2) + eps * s^2) * w

    Multiplying by a power of two is exact, so this is the textbook formula, rounding included;
    it only removes the range failures: squares of tiny rows never underflow (|x| < 1e-19 in
    fp32; below 2.4e-4 in fp16 arithmetic) and squares of huge rows never overflow (|x| > 1.8e19
    in fp32, where ``torch.nn.functional.rms_norm`` returns 0).

    eps: a Python float, converted once to the accumulation dtype (never to the input dtype:
    1e-12 is 0 in fp16) and added to the mean square of the *unscaled* row; ``eps * s^2`` is that
    same term in the scaled frame. When mean(x^2) << eps the output is x / sqrt(eps) and the
    gradient is amplified by up to 1 / sqrt(eps) (1e6 at eps = 1e-12): this is the correct value
    and is not clamped. An all-zero row gives y = 0 and dx = dy * w / sqrt(eps), finite. ``s``
    is a constant of the row (y does not depend on it), so autograd through this function yields
    the exact gradient. With ``zero_centered_gamma`` the stored weight is w - 1 (Transformer
    Engine's convention).

    Finiteness contract (both backends): y, dx and dweight are computed in fp32 and rounded once
    to the input dtype. In fp32 and bf16 (max 3.4e38) they are finite for every finite input,
    zero rows included. fp16 holds at most 65504: dx, which grows like dy * w / RMS(x) up to
    dy * w / sqrt(eps), overflows to +-inf exactly where the fp64 gradient is at least 65520
    (fp16's rounding threshold) and is correct to fp16 rounding everywhere else. At eps = 1e-12
    and |dy * w| ~ 0.1 this happens for rows with RMS below about 1e-5; fp16 training of such
    rows needs loss scaling that keeps dy small, or bf16.

Sigmoid output gate (gated attention)
    y = o * sigmoid(g) in fp32 (fp64 for fp64); g has o's shape (elementwise) or o's shape
    without the last (head_dim) dimension (headwise: one gate per head, broadcast over
    head_dim). The sigmoid is built from e = exp(-|g|) in (0, 1]::

        p = 1 / (1 + e) = sigmoid(|g|),   q = e * p = sigmoid(-|g|)
        sigmoid(g) = p if g >= 0 else q,  sigmoid'(g) = p * q

    so the derivative keeps full relative precision for large |g| (the usual
    sigmoid * (1 - sigmoid) is 0 in fp32 for g > 17).
"""

from __future__ import annotations

import torch


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64; fp32, bf16 and fp16 accumulate in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False
) -> torch.Tensor:
    """Small-eps-safe RMSNorm over the last dimension (the contract in this module's docstring).

    Args:
        x: (..., hidden) fp32, bf16, fp16 or fp64.
        weight: (hidden,) the gain w (or w - 1 when ``zero_centered_gamma``), any float dtype.
        eps: added to the mean square in the accumulation dtype (paper: 1e-12).
        zero_centered_gamma: the weight stores w - 1.

    Returns:
        (..., hidden) in x's dtype.
    """
    acc = _acc_dtype(x.dtype)
    xf = x.to(acc)
    eps_t = torch.tensor(eps, dtype=acc, device=x.device)
    with torch.no_grad():
        m = torch.maximum(xf.abs().amax(dim=-1, keepdim=True), eps_t.sqrt())
        _, exponent = torch.frexp(torch.where(torch.isfinite(m), m, torch.ones_like(m)))
        s = torch.ldexp(torch.ones_like(m), -exponent)
    x_hat = xf * s
    r_hat = 1.0 / torch.sqrt(x_hat.square().mean(dim=-1, keepdim=True) + eps_t * s * s)
    w = weight.to(acc) + 1.0 if zero_centered_gamma else weight.to(acc)
    return (x_hat * r_hat * w).to(x.dtype)


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
    acc = _acc_dtype(o.dtype)
    if g.shape == o.shape:
        gate = _sigmoid(g.to(acc))
    elif g.shape == o.shape[:-1]:
        gate = _sigmoid(g.to(acc)).unsqueeze(-1)
    else:
        raise ValueError(
            f"gate shape {tuple(g.shape)} fits neither o {tuple(o.shape)} (elementwise) nor "
            f"{tuple(o.shape[:-1])} (headwise)"
        )
    return (o.to(acc) * gate).to(o.dtype)


def _sigmoid(g: torch.Tensor) -> torch.Tensor:
    """sigmoid(g) from e = exp(-|g|); autograd through it yields sigmoid'(g) = p * q."""
    positive = g >= 0
    e = torch.exp(-torch.where(positive, g, -g))  # |g| with derivative sign(g), +1 at g = 0
    p = 1.0 / (1.0 + e)
    return torch.where(positive, p, e * p)

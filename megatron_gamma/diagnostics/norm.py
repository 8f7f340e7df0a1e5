"""RMSNorm saturation: where the epsilon, not the hidden state, sets the normalization factor.

Paper: *Scaling Limitation*, *RMSNorm Saturation*. RMSNorm computes
``y = h / sqrt(sigma^2(h) + eps) * w`` per token, with ``sigma^2(h) = mean_k h_k^2`` over the
hidden dimension (the mean square; RMSNorm does not subtract the mean). Once
``sigma^2(h) <~ eps`` the factor is ``~ 1/sqrt(eps)``, no longer ``1/sigma(h)``, and the norm
stops normalizing: small-initialized hidden states with the standard ``eps = 1e-5`` sit there,
which is why the paper lowers ``eps`` to ``1e-12``.

We call a token *saturated* when ``sigma^2(h) <= 10 eps`` (then ``eps`` is at least 1/11 of the
denominator ``sigma^2 + eps``); ``eps_share = eps / (sigma^2 + eps)`` gives the continuous
version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SATURATION_FACTOR = 10.0
"""A token is saturated when sigma^2(h) <= SATURATION_FACTOR * eps."""

HIST_EDGES = tuple(-24.0 + 0.25 * i for i in range(113))
"""log10 sigma^2(h) histogram bin edges: quarter decades from 1e-24 to 1e4 (values outside land
in the end bins)."""


@dataclass
class NormSaturation:
    """Saturation statistics of one norm layer on a batch of tokens.

    Attributes:
        eps: the norm's epsilon.
        tokens: number of tokens (rows) measured.
        saturated: fraction of tokens with ``sigma^2(h) <= factor * eps``, in [0, 1].
        eps_share: mean over tokens of ``eps / (sigma^2(h) + eps)``, in [0, 1].
        log10_ms_p05: 5th percentile of log10 sigma^2(h) (sigma^2 in squared hidden units).
        log10_ms_p50: median of log10 sigma^2(h).
        log10_ms_p95: 95th percentile of log10 sigma^2(h).
        histogram: token counts per bin of :data:`HIST_EDGES` (len(HIST_EDGES) - 1 bins).
    """

    eps: float
    tokens: int
    saturated: float
    eps_share: float
    log10_ms_p05: float
    log10_ms_p50: float
    log10_ms_p95: float
    histogram: list[int] = field(default_factory=list)

    def scalars(self) -> dict[str, float]:
        """The scalar fields, for logging."""
        return {
            "saturated": self.saturated,
            "eps_share": self.eps_share,
            "log10_ms_p05": self.log10_ms_p05,
            "log10_ms_p50": self.log10_ms_p50,
            "log10_ms_p95": self.log10_ms_p95,
        }


def mean_square(hidden: torch.Tensor) -> torch.Tensor:
    """``sigma^2(h) = mean_k h_k^2`` per token, accumulated in float32.

    Args:
        hidden: (..., hidden) norm input, any float dtype.

    Returns:
        float32 tensor (...,) in squared hidden units.
    """
    if hidden.dim() < 1 or hidden.size(-1) == 0:
        raise ValueError(f"hidden of shape {tuple(hidden.shape)}: need a last (hidden) dimension")
    return hidden.detach().float().pow(2).mean(dim=-1)


def saturation_from_mean_square(
    ms: torch.Tensor, eps: float, factor: float = SATURATION_FACTOR
) -> NormSaturation:
    """Saturation statistics from per-token mean squares (see :func:`rmsnorm_saturation`).

    Args:
        ms: (tokens,) or any shape of per-token ``sigma^2(h)`` values (>= 0).
        eps: the norm's epsilon (> 0).
        factor: saturation threshold in units of eps.

    Raises:
        ValueError: eps <= 0, no tokens, or negative mean squares.
    """
    if not eps > 0:
        raise ValueError(f"eps={eps}: must be > 0 (the RMSNorm epsilon)")
    x = ms.detach().double().reshape(-1)
    if x.numel() == 0:
        raise ValueError("no tokens: the norm input was empty")
    if bool((x < 0).any()):
        raise ValueError("negative mean square: pass sigma^2(h) = mean(h^2), not h")
    log10 = torch.log10(x.clamp_min(1e-300))
    q = torch.quantile(log10, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64, device=x.device))
    edges = torch.tensor(HIST_EDGES, dtype=torch.float64, device=x.device)
    idx = torch.bucketize(log10, edges[1:-1], right=True)
    hist = torch.bincount(idx, minlength=len(HIST_EDGES) - 1)
    return NormSaturation(
        eps=float(eps),
        tokens=int(x.numel()),
        saturated=float((x <= factor * eps).double().mean()),
        eps_share=float((eps / (x + eps)).mean()),
        log10_ms_p05=float(q[0]),
        log10_ms_p50=float(q[1]),
        log10_ms_p95=float(q[2]),
        histogram=[int(c) for c in hist.tolist()],
    )


def rmsnorm_saturation(
    hidden: torch.Tensor, eps: float, factor: float = SATURATION_FACTOR
) -> NormSaturation:
    """How many tokens an RMSNorm with this ``eps`` no longer normalizes.

    Args:
        hidden: (..., hidden) input of the norm layer (e.g. (s, b, h)).
        eps: the norm's epsilon.
        factor: a token is saturated when ``sigma^2(h) <= factor * eps`` (default 10).

    Returns:
        :class:`NormSaturation` over all tokens of ``hidden``.

    Raises:
        ValueError: eps <= 0 or an empty input.
    """
    return saturation_from_mean_square(mean_square(hidden), eps, factor)

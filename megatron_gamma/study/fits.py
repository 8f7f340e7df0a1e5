"""The statistics of ``megatron-gamma report``: scaling fits, effective model size, the best γ,
and seed-difference intervals. Pure numpy/scipy on float64 arrays; no I/O.

Paper: *Scaling Experiments* (loss against model size per arm; γ = 1 with both fixes matches a
baseline about 1.44x its size) and the γ sweep (best at γ = 1, worse above).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
from scipy import optimize, stats


@dataclass
class PowerLawFit:
    """``L(N) = E + A * N^(-alpha)`` fitted by least squares.

    Attributes:
        e, a, alpha: the fitted parameters (E in nats, N in parameters).
        e_err, a_err, alpha_err: one standard error of each from the fit's covariance; NaN when
            there are no more points than parameters (the fit then interpolates exactly).
        points: sizes used.
        rms_residual: root-mean-square of L - fit over the points, nats.
    """

    e: float
    a: float
    alpha: float
    e_err: float
    a_err: float
    alpha_err: float
    points: int
    rms_residual: float

    def loss(self, n: float | np.ndarray) -> float | np.ndarray:
        """The fitted loss at ``n`` parameters."""
        return self.e + self.a * np.power(n, -self.alpha)

    def size_at_loss(self, loss: float) -> float:
        """The N at which the fit reaches ``loss``: ``(A / (loss - E))^(1 / alpha)``; inf when
        ``loss <= E`` (never reached)."""
        if loss <= self.e:
            return math.inf
        return (self.a / (loss - self.e)) ** (1.0 / self.alpha)

    def as_dict(self) -> dict:
        return asdict(self)


def fit_power_law(sizes: Sequence[float], losses: Sequence[float]) -> PowerLawFit:
    """Fit ``L(N) = E + A * N^(-alpha)`` (scipy ``curve_fit``, trust-region reflective,
    A >= 0, alpha in [0, 3], E >= 0).

    The fit is done in ``x = N / N_max`` so that A stays near the loss scale; A is converted back
    to raw N (``A_raw = A_x * N_max^alpha``), and its error likewise.

    Args:
        sizes: (k,) model sizes in parameters, all > 0, at least 3 distinct; a size may repeat
            (one point per seed).
        losses: (k,) losses in nats.

    Returns:
        The fit with standard errors (NaN when k == 3: no residual degrees of freedom).

    Raises:
        ValueError: fewer than 3 distinct sizes, non-positive sizes, or a fit that fails.
    """
    n = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if n.shape != y.shape or n.ndim != 1 or n.size < 3:
        raise ValueError(f"need >= 3 (size, loss) pairs, got sizes {n.shape}, losses {y.shape}")
    if np.any(n <= 0) or np.unique(n).size < 3:
        raise ValueError(f"sizes={n.tolist()}: must be positive, at least 3 distinct")
    scale = float(n.max())
    x = n / scale

    def model(x, e, a, alpha):
        return e + a * np.power(x, -alpha)

    span = float(y.max() - y.min()) or 1.0
    p0 = (max(float(y.min()) - span, 0.0), span, 0.5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optimize.OptimizeWarning)  # 3 points: no covariance
            popt, pcov = optimize.curve_fit(
                model,
                x,
                y,
                p0=p0,
                bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 3.0]),
                method="trf",
                maxfev=20000,
            )
    except RuntimeError as e:
        raise ValueError(f"power-law fit did not converge on sizes {n.tolist()}: {e}") from e
    e_fit, a_x, alpha = (float(v) for v in popt)
    errs = np.sqrt(np.diag(pcov)) if np.all(np.isfinite(pcov)) else np.full(3, np.nan)
    if n.size == 3:
        errs = np.full(3, np.nan)
    a_raw = a_x * scale**alpha
    # d A_raw = scale^alpha dA_x + A_raw ln(scale) d alpha (first order, covariance ignored)
    a_err = float(np.hypot(errs[1] * scale**alpha, a_raw * math.log(scale) * errs[2]))
    resid = y - model(x, *popt)
    return PowerLawFit(
        e=e_fit,
        a=a_raw,
        alpha=alpha,
        e_err=float(errs[0]),
        a_err=a_err,
        alpha_err=float(errs[2]),
        points=int(n.size),
        rms_residual=float(np.sqrt(np.mean(resid**2))),
    )


def effective_size_multiplier(baseline: PowerLawFit, arm_loss: float, arm_size: float) -> float:
    """The effective model-size multiplier of an arm against the baseline.

    ``N_eff / N`` where ``N_eff`` is the size at which the baseline's fit reaches ``arm_loss``.
    For two power laws with the same E and alpha it equals ``(A_base / A_arm)^(1/alpha)`` at
    every size.

    Args:
        baseline: the baseline arm's fit.
        arm_loss: the arm's loss (nats) at ``arm_size``.
        arm_size: the arm's size in parameters (> 0).

    Returns:
        The multiplier (> 1: the arm is worth a bigger baseline); inf when the baseline never
        reaches ``arm_loss`` (``arm_loss <= E_base``).

    Raises:
        ValueError: ``arm_size <= 0``.
    """
    if arm_size <= 0:
        raise ValueError(f"arm_size={arm_size}: must be > 0")
    return baseline.size_at_loss(arm_loss) / arm_size


@dataclass
class ParabolaMinimum:
    """Minimum of a least-squares parabola ``L(γ) = c2 γ² + c1 γ + c0``.

    Attributes:
        gamma: the minimizing γ, ``-c1 / (2 c2)``; NaN when the parabola opens downwards.
        gamma_err: its standard error by the delta method from the fit's covariance; NaN with
            three points (no residual degrees of freedom) or no minimum.
        coefficients: (c2, c1, c0).
        best_measured: the measured γ with the lowest loss.
    """

    gamma: float
    gamma_err: float
    coefficients: tuple[float, float, float]
    best_measured: float

    def as_dict(self) -> dict:
        return asdict(self)


def parabola_minimum(gammas: Sequence[float], losses: Sequence[float]) -> ParabolaMinimum:
    """Fit a parabola to loss against γ and return its minimizer with an uncertainty.

    Args:
        gammas: (k,) γ values, k >= 3 distinct.
        losses: (k,) losses (nats), e.g. means over seeds.

    Raises:
        ValueError: fewer than 3 distinct γ values or mismatched lengths.
    """
    g = np.asarray(gammas, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if g.shape != y.shape or np.unique(g).size < 3:
        raise ValueError(f"gammas={g.tolist()}: need >= 3 distinct values, one loss each")
    design = np.stack([g**2, g, np.ones_like(g)], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    c2, c1, c0 = (float(v) for v in coef)
    best = float(g[np.argmin(y)])
    if c2 <= 0:
        return ParabolaMinimum(math.nan, math.nan, (c2, c1, c0), best)
    vertex = -c1 / (2 * c2)
    dof = g.size - 3
    err = math.nan
    if dof > 0:
        resid = y - design @ coef
        s2 = float(resid @ resid) / dof
        cov = s2 * np.linalg.inv(design.T @ design)
        grad = np.array([c1 / (2 * c2**2), -1 / (2 * c2), 0.0])
        err = float(math.sqrt(max(grad @ cov @ grad, 0.0)))
    return ParabolaMinimum(vertex, err, (c2, c1, c0), best)


@dataclass
class Difference:
    """Mean of paired per-seed differences ``arm - baseline`` with a Student-t interval.

    Attributes:
        mean: mean difference (nats; negative: the arm has lower loss).
        low, high: the ``level`` confidence interval; NaN with one seed.
        seeds: number of paired seeds.
        level: confidence level.
    """

    mean: float
    low: float
    high: float
    seeds: int
    level: float

    def as_dict(self) -> dict:
        return asdict(self)


def paired_difference(
    arm: Sequence[float], baseline: Sequence[float], level: float = 0.95
) -> Difference:
    """Paired difference over seeds: ``d_s = arm_s - baseline_s``; interval
    ``mean(d) ± t_{(1+level)/2, n-1} · sd(d) / sqrt(n)`` (sd with n - 1).

    Args:
        arm: (n,) the arm's values, one per seed.
        baseline: (n,) the baseline's values for the same seeds, same order.
        level: confidence level in (0, 1).

    Raises:
        ValueError: different lengths, no values, or level outside (0, 1).
    """
    a = np.asarray(arm, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"arm {a.shape} and baseline {b.shape}: need equal, non-empty lengths")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must lie in (0, 1)")
    d = a - b
    mean = float(d.mean())
    if d.size < 2:
        return Difference(mean, math.nan, math.nan, int(d.size), level)
    half = float(stats.t.ppf((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return Difference(mean, mean - half, mean + half, int(d.size), level)


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation (ddof 1; None for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)

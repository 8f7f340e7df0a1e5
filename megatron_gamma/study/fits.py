"""The statistics of ``megatron-gamma report``: scaling fits, effective model size and Student-t
intervals (paired seeds, sizes as units, slopes over sizes). Pure numpy/scipy on float64 arrays;
no I/O.

Paper: *Scaling Experiments* (loss against model size per arm; γ = 1 with both fixes matches a
baseline about 1.44x its size) and the γ sweep (best at γ = 1, worse above).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Optional

import numpy as np
from scipy import optimize, stats

from megatron_gamma.clustered import document_df


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
class Interval:
    """A mean with a Student-t confidence interval over independent units.

    Attributes:
        mean: the mean (nats for loss differences; negative: the arm has lower loss).
        low, high: the ``level`` confidence interval; NaN when ``df < 1``.
        n: number of units averaged.
        df: degrees of freedom of the interval (``n - 1`` for a mean, ``n - 2`` for a slope).
        unit: what one unit is: ``"seeds"`` (paired seeds within a size) or ``"sizes"`` (one
            per-size mean per size).
        level: confidence level.
        nonfinite: how many of the units are NaN or inf (a diverged run's loss); any gives no
            interval.
        seed_noise: with sizes as units, where the seed noise within the sizes set the width
            (:func:`size_interval`, :func:`trend_interval`): the variance of a size's mean that
            it alone gives (:func:`_seed_noise`), larger than the spread between the sizes'
            means; NaN where that spread set it.
        equal_seeds: with sizes as units, how many sizes have several seeds that all gave the
            same value; any gives no interval (those seeds did not change the runs, or the two
            arms compared are one run there).
    """

    mean: float
    low: float
    high: float
    n: int
    df: float
    unit: str = "seeds"
    level: float = 0.95
    nonfinite: int = 0
    seed_noise: float = math.nan
    equal_seeds: int = 0

    @property
    def has_interval(self) -> bool:
        return bool(np.isfinite(self.low) and np.isfinite(self.high))

    @property
    def is_slope(self) -> bool:
        """A slope over the units (:func:`trend_interval`, df = n − 2), not a mean."""
        return self.df == self.n - 2

    @property
    def no_spread(self) -> bool:
        """Several units with no spread about the estimate: all the same value (a mean, sd 0)
        or exactly on a line (a slope, residual sd 0), which estimates no variance, so there
        is no interval (:func:`t_interval`, :func:`trend_interval`)."""
        return self.n > 1 and not self.has_interval and not self.nonfinite and not self.equal_seeds

    def text(self, digits: int = 4) -> str:
        """``-0.4477 [-1.4052, +0.5098] (df 2, 3 sizes)``, ``+0.0830 (1 seed: no interval)``,
        ``+0.0000 (3 seeds, all equal: sd 0, no interval)``, for a slope ``+0.0000 (3
        sizes, on an exact line: residual sd 0, no interval)``, or ``n/a (3 seeds, 1 not
        finite: NaN or inf, no interval)``."""
        if not self.has_interval:
            unit = self.unit.split()[0]
            unit = unit[:-1] if self.n == 1 else unit
            if self.nonfinite:
                return (
                    f"n/a ({self.n} {unit}, {self.nonfinite} not finite: NaN or inf, no interval)"
                )
            if self.equal_seeds:
                return (
                    f"{self.mean:+.{digits}f} ({self.n} {unit}; at {self.equal_seeds} of them "
                    "every seed gave the same value (sd 0: the seeds did not change the runs, "
                    "or the two arms are one run there): no interval)"
                )
            why = ":"
            if self.no_spread:
                why = (
                    ", on an exact line: residual sd 0," if self.is_slope else ", all equal: sd 0,"
                )
            return f"{self.mean:+.{digits}f} ({self.n} {unit}{why} no interval)"
        df = f"{self.df:.0f}" if float(self.df).is_integer() else f"{self.df:.1f}"
        noise = (
            "; its width set by the seed noise within the sizes, which exceeds the spread "
            "between them"
            if math.isfinite(self.seed_noise)
            else ""
        )
        return (
            f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
            f"(df {df}, {self.n} {self.unit}{noise})"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def t_interval(values: Sequence[float], unit: str = "seeds", level: float = 0.95) -> Interval:
    """Mean of independent ``values`` with ``mean ± t_{(1+level)/2, n-1} · sd / sqrt(n)``
    (sd with n - 1); no interval (NaN) for one value, nor for values that are all equal: their
    sd of 0 would give a zero-width interval, a certainty the data cannot carry (identical
    seeds mean the seed did not change the run, or the arms are one run twice); nor when a
    value is NaN or inf (a diverged run's loss: ``nonfinite`` counts them), which is neither
    dropped (its failure is part of the arm's result) nor averaged.

    Raises:
        ValueError: no values, or level outside (0, 1).
    """
    d = np.asarray(values, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"values {d.shape}: need a non-empty 1-d sequence")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must lie in (0, 1)")
    mean = float(d.mean())
    bad = int(np.count_nonzero(~np.isfinite(d)))
    if bad or d.size < 2 or d.min() == d.max():
        return Interval(mean, math.nan, math.nan, int(d.size), d.size - 1, unit, level, bad)
    half = float(stats.t.ppf((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return Interval(mean, mean - half, mean + half, int(d.size), d.size - 1, unit, level)


def paired_difference(
    arm: Sequence[float], baseline: Sequence[float], level: float = 0.95
) -> Interval:
    """Paired difference over seeds: ``d_s = arm_s - baseline_s``, then :func:`t_interval`
    (df = seeds - 1).

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
    return t_interval(a - b, "seeds", level)


def _standard_error(d: Interval) -> float:
    """The standard error of an interval's mean, from its half-width: half / t."""
    return (d.high - d.low) / 2 / float(stats.t.ppf((1 + d.level) / 2, d.df))


def _seed_noise(variances: Sequence[float], counts: Sequence[int], seeds: Sequence[int]) -> float:
    """The mean over sizes of the variance of a size's mean that seed noise gives, σ²/n_s:
    σ² pooled over the sizes with >= 2 seeds (``variances`` of those, with their ``counts``),
    n_s the seeds of every size (``seeds``: a one-seed size's mean carries the whole σ²)."""
    df = sum(n - 1 for n in counts)
    pooled = sum((n - 1) * v for v, n in zip(variances, counts, strict=True)) / df
    return float(np.mean([pooled / n for n in seeds]))


def size_interval(per_size: Sequence[Interval], level: float = 0.95) -> Interval:
    """The mean of per-size effects with sizes as the unit of replication (df = sizes − 1),
    the variance of a size's mean taken as the larger of the spread between the sizes' means
    and the seed noise within them (:func:`_seed_noise`: the seed variance σ² pooled over the
    sizes with several seeds, read off their seed intervals, over each size's seed count): the
    random-effects variance τ² + σ²/n with τ² = max(0, spread − σ²/n) (DerSimonian–Laird,
    equal weights). Two sizes whose means land close by chance, each known only as well as its
    seeds allow, then give no narrower an interval than those seeds support. No interval where
    :func:`t_interval` gives none over the means (one size, a NaN or inf mean, equal means
    without seed noise to measure), nor where a size's several seeds all gave the same value
    (``equal_seeds``).

    Args:
        per_size: each size's interval over its seeds (:func:`paired_difference`), at ``level``;
            a one-seed size has none, adds nothing to σ² and takes σ² whole.
    """
    means = [d.mean for d in per_size]
    base = t_interval(means, "sizes", level)
    equal = sum(d.no_spread for d in per_size)
    if equal:
        return replace(base, low=math.nan, high=math.nan, equal_seeds=equal)
    spread = [d for d in per_size if d.has_interval]
    if base.nonfinite or len(means) < 2 or not spread:
        return base
    noise = _seed_noise(
        [_standard_error(d) ** 2 * d.n for d in spread],
        [d.n for d in spread],
        [d.n for d in per_size],
    )
    if base.has_interval and float(np.var(means, ddof=1)) >= noise:
        return base
    half = float(stats.t.ppf((1 + level) / 2, len(means) - 1) * math.sqrt(noise / len(means)))
    return replace(base, low=base.mean - half, high=base.mean + half, seed_noise=noise)


def crossed_interval(
    per_seed: Sequence[float],
    leave_one_out: Sequence[float],
    tokens: Sequence[int],
    level: float = 0.95,
) -> Interval:
    """The mean over seeds of a statistic computed on the same sampled documents in every
    seed, with the documents' sampling in its interval as well as the seeds'.

    Every seed scores the same held-out documents, so an interval over seeds alone treats those
    documents as fixed: it speaks for them, not for text in general. The standard error here
    adds the two: SE² = var(per_seed) / n (the seeds') + the jackknife variance over documents
    of the seed-mean statistic, (D − 1)/D · Σ_d (θ₋d − θ̄)² over ``leave_one_out`` (θ₋d: the
    statistic without document d). Its df is Welch–Satterthwaite's, never above n − 1, so the
    interval is never narrower than the seeds' alone. The document term's own df is
    design-based, :func:`document_df` of the documents' ``tokens``: the Bell–McCaffrey df of a
    token mean clustered into those documents (D − 1 for documents of equal length, towards 1
    where one holds most tokens). That df is exact for the CR2 variance of a plain token mean;
    it is taken here for the jackknife of a statistic that is not one (a difference of means
    over parts of the tokens), an approximation. Both parts carry the seed × document
    interaction, which counts it twice: conservative.

    Args:
        per_seed: (n,) the statistic per seed, on all documents.
        leave_one_out: (D,) the seed-mean statistic with each document left out in turn.
        tokens: (D,) the scored tokens of each document, in ``leave_one_out``'s order.

    Returns:
        An :class:`Interval` with ``unit`` "seeds × D documents"; no interval where
        :func:`t_interval` over the seeds gives none.

    Raises:
        ValueError: fewer than 2 documents, a leave-one-out value that is not finite (the
            documents' sampling cannot be measured), or ``tokens`` not one count >= 1 per
            document.
    """
    base = t_interval(per_seed, "seeds", level)
    jack = np.asarray(leave_one_out, dtype=np.float64)
    if jack.size < 2 or not np.all(np.isfinite(jack)):
        raise ValueError(
            f"leave-one-document-out values {jack.tolist()}: need >= 2 documents, each leaving "
            "a finite statistic, to measure the documents' sampling"
        )
    if len(tokens) != jack.size:
        raise ValueError(f"{len(tokens)} token counts for {jack.size} documents: need one each")
    doc_df = document_df(tokens)
    unit = f"seeds × {jack.size} documents"
    if not base.has_interval:
        return replace(base, unit=unit)
    d = jack.size
    seed_var = _standard_error(base) ** 2
    doc_var = float((d - 1) / d * np.sum((jack - jack.mean()) ** 2))
    total = seed_var + doc_var
    welch = total**2 / (seed_var**2 / base.df + doc_var**2 / doc_df)
    df = min(float(base.df), welch)
    half = float(stats.t.ppf((1 + level) / 2, df) * math.sqrt(total))
    return replace(base, low=base.mean - half, high=base.mean + half, df=df, unit=unit)


EXACT_LINE = 1e-12
"""Residual sd of a trend, relative to its largest per-size mean (at least 1), at or below
which the means lie on an exact line (:func:`trend_interval`): least squares leaves rounding
residuals of about 1e-16 on collinear points."""


def trend_interval(
    x: Sequence[float], groups: Sequence[Sequence[float]], level: float = 0.95
) -> Interval:
    """Slope of a per-unit effect against ``x`` (e.g. ln N), sizes as the unit of replication:
    the least-squares slope of the per-size means on ``x`` with its Student-t interval,
    df = sizes − 2. Seeds within a size say nothing about how the effect varies between
    sizes, so two sizes give no trend interval; they do bound how well each size's mean is
    known: the residual variance of the means is taken as at least the seed noise within the
    sizes (:func:`_seed_noise`, one-seed sizes included), as in
    :func:`size_interval`, so that a line through means that landed close to it by chance is no
    surer than the seeds allow (``seed_noise``). Means exactly on a line (residual sd 0 up to
    rounding, e.g. two arms that are one run twice: every mean 0) give no interval (NaN), as
    equal values do in :func:`t_interval`: a zero-width interval would be a certainty the data
    cannot carry; so does a size whose several seeds all gave the same value
    (``equal_seeds``), and NaN or inf values (``nonfinite`` counts the sizes whose mean is not
    finite).

    Args:
        x: (k,) the sizes' abscissae, distinct, k >= 3.
        groups: k sequences of per-seed effects.

    Raises:
        ValueError: fewer than 3 sizes, mismatched lengths or an empty size.
    """
    xs = np.asarray(x, dtype=np.float64)
    gs = [np.asarray(g, dtype=np.float64) for g in groups]
    if xs.size != len(gs) or xs.size < 3 or any(g.size == 0 for g in gs):
        raise ValueError(f"need >= 3 sizes with >= 1 value each, got {[g.size for g in gs]}")
    means = np.array([g.mean() for g in gs])
    bad = int(np.count_nonzero(~np.isfinite(means)))
    if bad:
        return Interval(
            math.nan, math.nan, math.nan, int(xs.size), xs.size - 2, "sizes", level, bad
        )
    xc = xs - xs.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ means / sxx)
    resid = means - means.mean() - slope * xc
    df = xs.size - 2
    sd = math.sqrt(resid @ resid / df)
    if sd <= EXACT_LINE * max(1.0, float(np.abs(means).max())):
        return Interval(slope, math.nan, math.nan, int(xs.size), df, "sizes", level)
    several = [g for g in gs if g.size > 1]
    equal = sum(bool(g.min() == g.max()) for g in several)
    if equal:
        return Interval(
            slope, math.nan, math.nan, int(xs.size), df, "sizes", level, equal_seeds=equal
        )
    noise = (
        _seed_noise(
            [g.var(ddof=1) for g in several], [g.size for g in several], [g.size for g in gs]
        )
        if several
        else 0.0
    )
    half = float(stats.t.ppf((1 + level) / 2, df) * math.sqrt(max(sd**2, noise) / sxx))
    return Interval(
        slope, slope - half, slope + half, int(xs.size), df, "sizes", level,
        seed_noise=noise if noise > sd**2 else math.nan,
    )  # fmt: skip


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation (ddof 1; None for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None)

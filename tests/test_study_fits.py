"""The statistics of ``megatron-gamma report`` against closed forms and hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from megatron_gamma.study.fits import (
    PowerLawFit,
    crossed_interval,
    effective_size_multiplier,
    fit_power_law,
    paired_difference,
    size_interval,
    t_interval,
    trend_interval,
)


@pytest.mark.parametrize(
    "e, a, alpha",
    [(2.0, 60.0, 0.34), (1.7, 400.0, 0.5), (3.1, 12.0, 0.2)],
)
def test_power_law_fit_recovers_parameters_with_noise(e, a, alpha):
    rng = np.random.default_rng(0)
    n = np.geomspace(1e5, 1e9, 9)
    loss = e + a * n**-alpha
    noisy = loss * (1 + 2e-4 * rng.standard_normal(n.size))
    fit = fit_power_law(n, noisy)
    assert fit.e == pytest.approx(e, rel=0.02)
    assert fit.a == pytest.approx(a, rel=0.02)
    assert fit.alpha == pytest.approx(alpha, rel=0.02)
    assert fit.points == 9 and np.isfinite(fit.alpha_err) and fit.alpha_err < 0.02 * alpha
    assert fit.loss(1e7) == pytest.approx(e + a * 1e7**-alpha, rel=1e-3)


def test_power_law_fit_three_points_has_no_error_bars_and_rejects_bad_input():
    n = np.array([1e5, 1e6, 1e7])
    fit = fit_power_law(n, 2.0 + 30.0 * n**-0.3)
    assert math.isnan(fit.alpha_err) and fit.rms_residual < 1e-6
    with pytest.raises(ValueError, match="need >= 3"):
        fit_power_law([1e5, 1e6], [3.0, 2.9])
    with pytest.raises(ValueError, match="at least 3 distinct"):
        fit_power_law([1e5, 1e5, 1e6], [3.0, 2.9, 2.8])
    # one point per seed: repeated sizes give residual degrees of freedom
    seeds = np.repeat(n, 2)
    fit = fit_power_law(seeds, 2.0 + 30.0 * seeds**-0.3 + np.tile([1e-3, -1e-3], 3))
    assert fit.points == 6 and np.isfinite(fit.alpha_err)
    assert fit.alpha == pytest.approx(0.3, rel=1e-4)


def test_effective_size_multiplier_equals_closed_form():
    e, alpha, a_base, a_arm = 2.0, 0.3, 40.0, 30.0
    base = PowerLawFit(e, a_base, alpha, 0.0, 0.0, 0.0, 5, 0.0)
    for n in (1e6, 3e7, 1e9):
        arm_loss = e + a_arm * n**-alpha
        expected = (a_base / a_arm) ** (1 / alpha)  # same E, alpha: independent of N
        assert effective_size_multiplier(base, arm_loss, n) == pytest.approx(expected, rel=1e-12)
    # through the fit of exact baseline points
    sizes = np.geomspace(1e6, 1e9, 6)
    fitted = fit_power_law(sizes, e + a_base * sizes**-alpha)
    got = effective_size_multiplier(fitted, e + a_arm * 1e7**-alpha, 1e7)
    assert got == pytest.approx((a_base / a_arm) ** (1 / alpha), rel=1e-4)
    assert effective_size_multiplier(base, e - 0.1, 1e6) == math.inf


def test_paired_difference_matches_hand_computation():
    arm, base = [3.1, 3.3, 3.2], [3.0, 3.25, 3.3]
    # d = [0.10, 0.05, -0.10]; mean 0.05/3; sum of squared deviations 0.0216667 → sd 0.1040833
    mean = 0.05 / 3
    sd = math.sqrt((0.1 - mean) ** 2 + (0.05 - mean) ** 2 + (-0.1 - mean) ** 2) / math.sqrt(2)
    t_975_df2 = 4.302652729749464  # Student t table, 97.5th percentile, 2 degrees of freedom
    half = t_975_df2 * sd / math.sqrt(3)
    d = paired_difference(arm, base)
    assert d.mean == pytest.approx(mean, abs=1e-12)
    assert d.low == pytest.approx(mean - half, abs=1e-9)
    assert d.high == pytest.approx(mean + half, abs=1e-9)
    assert half == pytest.approx(0.258557, abs=1e-6)
    one = paired_difference([3.0], [3.2])
    assert one.mean == pytest.approx(-0.2) and math.isnan(one.low)
    with pytest.raises(ValueError, match="equal"):
        paired_difference([1.0, 2.0], [1.0])


def test_equal_values_give_no_interval_rather_than_a_zero_width_one():
    """Seeds that all give the same difference (the seed did not change the run) have sd 0;
    t · 0 / sqrt(n) would be an interval of width 0, i.e. certainty from no variance at all."""
    d = paired_difference([4.7, 4.7, 4.7], [5.0, 5.0, 5.0])
    assert d.mean == pytest.approx(-0.3, abs=1e-12) and d.n == 3 and d.df == 2
    assert math.isnan(d.low) and math.isnan(d.high) and d.no_spread
    assert d.text() == "-0.3000 (3 seeds, all equal: sd 0, no interval)"
    near = paired_difference([4.7, 4.7, 4.7 + 1e-9], [5.0, 5.0, 5.0])
    assert near.has_interval and not near.no_spread and near.high - near.low > 0
    one = paired_difference([4.7], [5.0])
    assert not one.no_spread and one.text() == "-0.3000 (1 seed: no interval)"


def test_trend_interval_matches_linregress_and_has_none_on_an_exact_line():
    """The slope's interval is scipy's OLS slope ± t(0.975, sizes − 2) · its standard error; per-
    size means exactly on a line (here, collinear up to rounding) have no residual spread, so no
    interval rather than one of width ~1e-16."""
    x = np.log([1e6, 4e6, 1.6e7, 6.4e7])
    groups = [[0.50, 0.52, 0.47], [0.31, 0.29], [0.22, 0.18, 0.2], [0.04]]
    means = np.array([np.mean(g) for g in groups])
    fit = stats.linregress(x, means)
    half = stats.t.ppf(0.975, 2) * fit.stderr
    iv = trend_interval(x, groups)
    assert (iv.mean, iv.low, iv.high) == pytest.approx(
        (fit.slope, fit.slope - half, fit.slope + half), abs=1e-12
    )
    assert (iv.n, iv.df, iv.unit) == (4, 2, "sizes") and iv.is_slope
    line = trend_interval(x[:3], [[0.5 - 0.1 * i] for i in range(3)])
    assert line.mean == pytest.approx(-0.1 / (x[1] - x[0]), rel=1e-12)
    assert math.isnan(line.low) and line.no_spread
    assert (
        line.text() == f"{line.mean:+.4f} (3 sizes, on an exact line: residual sd 0, no interval)"
    )


def test_nan_or_inf_values_give_no_interval_and_are_counted():
    """A diverged run's loss (NaN, or inf) among the units: numpy's sd is NaN, so there is no
    interval; it is counted, and not mistaken for units that are all equal."""
    values = [0.1, math.nan, 0.2, math.inf]
    assert math.isnan(np.std(values, ddof=1))
    iv = t_interval(values)
    assert (iv.n, iv.df, iv.nonfinite) == (4, 3, 2) and not iv.has_interval and not iv.no_spread
    assert iv.text() == "n/a (4 seeds, 2 not finite: NaN or inf, no interval)"
    x = np.log([1e6, 4e6, 1.6e7])
    slope = trend_interval(x, [[0.5, 0.4], [math.inf], [0.1, 0.2]])
    assert (slope.n, slope.df, slope.nonfinite) == (3, 1, 1) and not slope.no_spread


def test_the_scaling_plot_title_speaks_of_fit_lines_only_when_it_draws_one(monkeypatch):
    """The title promised 'lines: E + A·N^−α' on a plot without a line (no arm fitted)."""
    from megatron_gamma.study import plots

    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or path)
    n = np.array([1e5, 3e5, 1e6, 3e6, 1e7])
    arm = {"sizes": list(n), "mean": list(2.0 + 30.0 * n**-0.3), "std": [None] * 5}
    plots.plot_scaling({"a": {**arm, "fit": None}}, "unused.png")
    plots.plot_scaling({"a": {**arm, "fit": fit_power_law(n, arm["mean"])}}, "unused.png")
    (no_fit,), (fitted,) = (fig.axes for fig in saved)
    assert no_fit.get_title().endswith("no fit: < 4 sizes, or α not identified)")
    assert no_fit.get_title().startswith("loss against model size at the shared LR (")
    assert no_fit.get_xlabel() == "non-embedding parameters N of the baseline arm"
    curves = [[ln for ln in ax.lines if len(ln.get_xdata()) == 50] for ax in (no_fit, fitted)]
    assert curves[0] == [] and len(curves[1]) == 1  # a fit is drawn as a 50-point curve
    assert fitted.get_title().endswith("lines: fits E + A·N^−α)")
    np.testing.assert_allclose(curves[1][0].get_ydata()[[0, -1]], arm["mean"][::4], rtol=1e-3)


def test_a_trajectory_plot_draws_the_rule_threshold_beside_the_reference(monkeypatch):
    """The sink plot's y range was set by a 0.001 spread, which filled the plot; a dotted line
    where claim 5 starts counting a sink (uniform + 0.01) keeps it in proportion."""
    from megatron_gamma.study import plots

    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or path)
    series = {"a (d64)": {0: 0.0610, 16: 0.0612}, "b (d64)": {0: 0.0594, 16: 0.0595}}
    plots.plot_trajectories(series, "unused.png", "share", "sink", reference=0.0594,
                            reference_label="uniform", threshold=0.0694,
                            threshold_label="uniform + 0.01")  # fmt: skip
    (ax,) = saved[0].axes
    flat = {ln.get_label(): ln.get_ydata()[0] for ln in ax.lines if ln.get_label() != "_nolegend_"}
    assert flat["uniform"] == 0.0594 and flat["uniform + 0.01"] == pytest.approx(0.0694)
    low, high = ax.get_ylim()
    assert low <= 0.0594 and high >= 0.0694  # the 0.0017 spread is a sixth of the range or less
    assert (0.0612 - 0.0595) / (high - low) < 0.2


def test_the_lr_grid_plot_ticks_the_grid_learning_rates_only(monkeypatch):
    """The log axis's minor labels (2e-3, 3e-3, 4e-3, ...) overlapped; the ticks are the grid's
    learning rates, and the best LR of each arm is circled at its loss."""
    from megatron_gamma.study import plots

    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or path)
    grid = {0.0015: 8.7, 0.003: 8.5, 0.006: 8.2, 0.012: 7.7, 0.024: 7.4}
    inside = {**grid, 0.024: 7.9}  # best at 0.012, bracketed
    plots.plot_lr_grid({"d32": {"baseline": grid, "gamma1": {k: v - 0.3 for k, v in grid.items()},
                                "gamma1+eps": inside}}, "unused.png")  # fmt: skip
    (ax,) = saved[0].axes
    saved[0].canvas.draw()
    assert list(ax.get_xticks()) == sorted(grid)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "0.0015",
        "0.003",
        "0.006",
        "0.012",
        "0.024",
    ]
    assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))
    circled = [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]
    circled_at = [ln.get_xydata()[0] for ln in circled]
    np.testing.assert_allclose(circled_at, [[0.024, 7.4], [0.024, 7.1], [0.012, 7.7]])
    assert [ln.get_marker() for ln in circled] == ["s", "s", "o"]  # the edge ones squared
    assert "squared: a best LR on the grid's edge, not bracketed" in saved[0].get_suptitle()


def test_the_gamma_plot_draws_the_seed_spread_and_calls_the_lowest_mean_an_estimate(monkeypatch):
    """Trial 4: loss_vs_gamma.png drew means without their seed spread and a line at the
    lowest mean even where claim 6 was inconclusive. Each point now carries the sd over its
    matched seeds (fp64 by hand here), and the title says the dashed line is a point estimate."""
    from megatron_gamma.study import plots

    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or path)
    per_seed = {0.5: [5.10, 5.16, 5.13], 1.0: [5.02, 5.12, 5.05], 2.0: [5.30, 5.31, 5.35]}
    means = [float(np.mean(v)) for v in per_seed.values()]
    entry = {"gamma": list(per_seed), "mean": means, "seeds": [1, 2, 3], "per_seed": per_seed}
    one = {"gamma": [0.5, 1.0], "mean": [5.1, 5.0], "seeds": [1],
           "per_seed": {0.5: [5.1], 1.0: [5.0]}, "best": 1.0}  # fmt: skip
    plots.plot_gamma({"d64 (shared LR)": {**entry, "best": 1.0}, "d32": one}, "unused.png")
    (ax,) = saved[0].axes
    bars = [c for c in ax.containers if hasattr(c, "has_yerr") and c.has_yerr]
    segments = bars[0].lines[2][0].get_segments()
    half = [float(seg[1][1] - seg[0][1]) / 2 for seg in segments]
    pairs = zip(per_seed.values(), means, strict=True)
    sd = [math.sqrt(sum((x - m) ** 2 for x in v) / 2) for v, m in pairs]
    np.testing.assert_allclose(half, sd, rtol=1e-12)
    np.testing.assert_allclose(bars[1].lines[2][0].get_segments()[0][:, 1], [5.1, 5.1])  # 1 seed
    assert [ln.get_linestyle() for ln in ax.lines if ln.get_xdata()[0] == 1.0][-1] == "--"
    assert "the lowest mean, a point estimate" in ax.get_title()


def test_sizes_as_units_are_no_surer_than_the_seeds_within_them():
    """Trial 5: two sizes, two seeds each, paired differences -0.35/+0.25 and -0.30/+0.198:
    each size's seed interval spans about ±3.8 nats, but the size means (-0.050, -0.051) land
    0.001 apart, and t over the two means alone gave [-0.0569, -0.0441]: "reproduced". The
    variance of a size mean is now at least what its seeds give (random effects, τ² =
    max(0, spread − SE²), equal weights), by hand in fp64 here."""
    groups = [[-0.35, 0.25], [-0.30, 0.198]]
    per_size = [t_interval(g) for g in groups]
    means = [np.mean(g) for g in groups]
    naive = t_interval(means, "sizes")
    assert naive.high < -0.01  # the pseudo-certain interval
    se2 = [np.var(g, ddof=1) / 2 for g in groups]
    assert np.var(means, ddof=1) < np.mean(se2)
    half = stats.t.ppf(0.975, 1) * math.sqrt(np.mean(se2) / 2)
    got = size_interval(per_size)
    assert (got.low, got.high, got.df, got.n) == pytest.approx(
        (np.mean(means) - half, np.mean(means) + half, 1, 2), rel=1e-12
    )
    assert got.low < -1 and got.high > 1
    assert "its width set by the seed noise within the sizes" in got.text()
    # sizes that truly differ more than their seeds: the spread between them sets the width
    apart = [t_interval([-0.50, -0.49, -0.51]), t_interval([-0.10, -0.11, -0.09])]
    assert size_interval(apart) == t_interval([-0.50, -0.10], "sizes")
    # a size whose seeds all gave the same value: those seeds did not change the run
    equal = size_interval([t_interval([-0.13, -0.13]), t_interval([-0.10, -0.14])])
    assert not equal.has_interval and equal.equal_seeds == 1
    assert equal.text() == (
        "-0.1250 (2 sizes; at 1 of them every seed gave the same value (sd 0: the seeds did not "
        "change the runs, or the two arms are one run there): no interval)"
    )
    # trial 6: four seeds at one size, one at two others. A one-seed size's mean carries the
    # whole seed variance σ², pooled from the sizes that measure it: σ²/n for every size
    mixed = {"s1": [-0.17, -0.07, -0.12, -0.12], "s2": [-0.121], "s3": [-0.119]}
    sigma2 = np.var(mixed["s1"], ddof=1)
    noise = np.mean([sigma2 / len(g) for g in mixed.values()])
    means = [np.mean(g) for g in mixed.values()]
    half = stats.t.ppf(0.975, 2) * math.sqrt(noise / 3)
    got = size_interval([t_interval(g) for g in mixed.values()])
    assert (got.low, got.high) == pytest.approx(
        (np.mean(means) - half, np.mean(means) + half), rel=1e-12
    )
    assert got.high > -0.05  # the one-seed sizes' noise counted: no longer beyond δ = 0.05
    # one seed at every size: no seed noise to measure, the spread between sizes alone
    single = [t_interval([-0.2]), t_interval([-0.3]), t_interval([-0.25])]
    assert size_interval(single) == t_interval([-0.2, -0.3, -0.25], "sizes")


def test_a_trend_is_no_surer_than_the_seeds_within_its_sizes():
    """Three sizes whose mean advantages lie within 0.001 of a line while each size's two seeds
    differ by 0.6 nats: the residual sd alone gave a narrow slope interval. The residual
    variance is now at least the mean squared standard error of the size means (fp64 here)."""
    x = np.log([1e6, 4e6, 1.6e7])
    groups = [[0.60, 0.0], [0.45, -0.149], [0.30, -0.301]]
    means = np.array([np.mean(g) for g in groups])
    fit = stats.linregress(x, means)
    narrow = stats.t.ppf(0.975, 1) * fit.stderr
    noise = np.mean([np.var(g, ddof=1) / 2 for g in groups])
    sxx = np.sum((x - x.mean()) ** 2)
    assert fit.stderr**2 * sxx < noise  # the residual variance is below the seed noise
    half = stats.t.ppf(0.975, 1) * math.sqrt(noise / sxx)
    got = trend_interval(x, groups)
    assert got.mean == pytest.approx(fit.slope, rel=1e-12)
    assert (got.low, got.high) == pytest.approx((fit.slope - half, fit.slope + half), rel=1e-12)
    assert half > 20 * narrow and math.isfinite(got.seed_noise)
    same = trend_interval(x, [[0.6, 0.6], [0.45, -0.149], [0.30, -0.301]])
    assert not same.has_interval and same.equal_seeds == 1


def test_crossed_interval_adds_the_document_jackknife_to_the_seeds():
    """Three seeds (1.0, 1.2, 1.1) and four leave-one-document-out means, the documents of 1,
    1, 1 and 3 tokens: SE² = s²/3 + (3/4)·Σ(θ₋d − θ̄)²; df by Welch–Satterthwaite with the
    document term's design-based df, Bell–McCaffrey's for shares (1/6, 1/6, 1/6, 1/2), by
    hand 1 / (3 · (1/36)(2/3)/(25/36) + (3 · (1/36)/(5/6) + (1/4)/(1/2))²) = 25/11 (trial 9
    #10: the data-based (Σa)²/Σa² − 1 had a median near D/3 − 1 for equal documents, not the
    D − 1 its docstring said), capped at the seeds' 2; closed form by hand. One document, a
    NaN, or token counts that do not match the documents are refused; one seed gives no
    interval."""
    per_seed, left, tokens = [1.0, 1.2, 1.1], [1.05, 1.15, 1.0, 1.2], [1, 1, 1, 3]
    seed_se2 = 0.01 / 3  # s² = (0.1² + 0.1² + 0) / 2
    doc_se2 = 0.75 * 0.025  # Σ(θ₋d − θ̄)², θ̄ = 1.1: 0.05² + 0.05² + 0.1² + 0.1²
    welch = (seed_se2 + doc_se2) ** 2 / (seed_se2**2 / 2 + doc_se2**2 / (25 / 11))
    assert 2 < welch < 4  # so the cap binds
    half = stats.t.ppf(0.975, 2) * math.sqrt(seed_se2 + doc_se2)
    iv = crossed_interval(per_seed, left, tokens)
    assert (iv.mean, iv.df, iv.n) == (pytest.approx(1.1), 2.0, 3)
    assert iv.unit == "seeds × 4 documents"
    assert (iv.low, iv.high) == pytest.approx((1.1 - half, 1.1 + half))
    assert iv.text().endswith("(df 2, 3 seeds × 4 documents)")
    # ten seeds: the documents' df, not the seeds', sets the Welch df
    many = [1.0, 1.2, 1.1, 1.05, 1.15, 1.1, 1.1, 1.0, 1.2, 1.1]
    seed_se2 = np.var(many, ddof=1) / 10
    df = (seed_se2 + doc_se2) ** 2 / (seed_se2**2 / 9 + doc_se2**2 / (25 / 11))
    iv = crossed_interval(many, left, tokens)
    assert iv.df == pytest.approx(df) and 25 / 11 < df < 3
    half = stats.t.ppf(0.975, df) * math.sqrt(seed_se2 + doc_se2)
    assert (iv.low, iv.high) == pytest.approx((1.1 - half, 1.1 + half))
    for bad in ([1.1], [1.1, math.nan]):
        with pytest.raises(ValueError, match="need >= 2 documents"):
            crossed_interval(per_seed, bad, [1] * len(bad))
    with pytest.raises(ValueError, match="3 token counts for 4 documents"):
        crossed_interval(per_seed, left, [1, 1, 1])
    assert not crossed_interval([1.0], left, tokens).has_interval

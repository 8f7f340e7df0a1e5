"""The preprocessing benchmark's ratio statistics (``tools/bench_preprocess.py``): the geometric
mean of per-round ratios with its Student-t interval, checked against scipy's own interval of
the logarithms, the met / not met / inconclusive calls against a target, and the user / system
split of the CPU clocks."""

import math

import numpy as np
import pytest
from helpers import load_tool
from scipy import stats


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_preprocess")


def test_rounds_ratio_is_scipys_t_interval_of_the_logs_mapped_back(bench):
    ratios = [1.11, 0.93, 1.04, 1.19, 0.98]
    logs = np.log(ratios)
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    iv = bench.rounds_ratio(ratios)
    assert iv.mean == pytest.approx(stats.gmean(ratios), rel=1e-12)
    assert (iv.low, iv.high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    assert (iv.n, iv.df, iv.unit) == (5, 4, "rounds")
    assert bench.ratio_text(iv) == (
        f"{iv.mean:.2f}x [{math.exp(low):.2f}, {math.exp(high):.2f}] (df 4, 5 rounds)"
    )


def test_the_ratio_of_inverted_rounds_is_the_inverse(bench):
    ratios = [1.3, 0.8, 1.1]
    iv, inv = bench.rounds_ratio(ratios), bench.rounds_ratio([1 / r for r in ratios])
    assert inv.mean == pytest.approx(1 / iv.mean, rel=1e-12)
    assert (inv.low, inv.high) == pytest.approx((1 / iv.high, 1 / iv.low), rel=1e-12)


@pytest.mark.parametrize(
    "ratios, low, high, call",
    [
        ([1.10, 1.12, 1.11, 1.09], 1.0, math.inf, "met"),
        ([0.90, 0.92, 0.91, 0.89], 1.0, math.inf, "not met"),
        ([0.90, 1.12, 1.02, 0.97], 1.0, math.inf, "inconclusive"),
        ([1.01, 0.99, 1.00, 1.02], 0.9, 1.1, "met"),
        ([1.25, 1.22, 1.24, 1.23], 0.9, 1.1, "not met"),
        ([1.05, 1.25, 1.10, 0.95], 0.9, 1.1, "inconclusive"),
    ],
)
def test_against_calls_a_target_met_only_when_the_whole_interval_clears_it(
    bench, ratios, low, high, call
):
    assert bench.against(bench.rounds_ratio(ratios), low, high) == call


def test_one_round_gives_no_interval_and_no_verdict(bench):
    iv = bench.rounds_ratio([1.4])
    assert iv.mean == pytest.approx(1.4) and not iv.has_interval
    assert bench.ratio_text(iv) == "1.40x (1 round: no interval)"
    assert bench.against(iv, 1.0) == "inconclusive (no interval)"


@pytest.mark.parametrize("ratios", [[], [1.0, 0.0], [1.0, -2.0]])
def test_rounds_ratio_refuses_empty_or_non_positive_ratios(bench, ratios):
    with pytest.raises(ValueError, match="need at least one, all > 0"):
        bench.rounds_ratio(ratios)


def test_usage_splits_the_cpu_clock_into_getrusages_user_and_system_time(bench):
    before = bench._usage()
    total = sum(i * i for i in range(2_000_000))  # user time
    assert total > 0
    after = bench._usage()
    assert after["cpu"] == pytest.approx(after["user"] + after["system"], abs=1e-9)
    assert after["user"] - before["user"] > 0.01
    assert after["system"] >= before["system"]


def test_cpu_split_gives_each_clocks_own_median_and_the_system_share_of_the_total(bench):
    runs = [
        {"user": 1.0, "system": 0.5, "cpu": 1.5},
        {"user": 3.0, "system": 0.1, "cpu": 3.1},
        {"user": 2.0, "system": 0.3, "cpu": 2.3},
        {"user": 0.5, "system": 0.9, "cpu": 1.4},
    ]
    user, system, total = (
        float(np.median([r[k] for r in runs])) for k in ("user", "system", "cpu")
    )
    assert (user, system, total) == (1.5, 0.4, 1.9)  # medians of even counts: the middle pair
    assert bench.cpu_split(runs) == (
        f"user {user:.3f}, system {system:.3f}, total {total:.3f} CPU-s (system 21 %)"
    )


@pytest.mark.parametrize(
    "low, high, text",
    [
        (1.0009, 1.2312, "[1.001, 1.23]"),  # met by the third decimal, shown so
        (0.9996, 1.2312, "[0.9996, 1.23]"),  # not met: 1.00 would hide it
        (1.0, 1.2954, "[1.00, 1.295]"),  # a bound on the target prints as it
        (0.8962, 1.1047, "[0.896, 1.105]"),  # the re-creation's band edges
        (1.0312, 1.1844, "[1.03, 1.18]"),
    ],
)
def test_a_bound_that_two_decimals_would_round_onto_a_target_gets_more(bench, low, high, text):
    from megatron_gamma.study.fits import Interval

    iv = Interval(1.1, low, high, 5, 4, "windows")
    assert bench.ratio_text(iv) == f"1.10x {text} (df 4, 5 windows)"
    call = bench.against(iv, 1.0)
    assert call == ("met" if low >= 1.0 else "inconclusive")

"""Megatron-LM's ``--check-for-nan-in-loss-and-grad`` (on by default): a run whose training
loss is NaN stops at that iteration with exit status 1, logs and saves nothing of it;
``--no-check-for-nan-in-loss-and-grad`` trains on to the end, as study sweeps do.

The NaN comes from initialization: N(0, (1e20)^2) weights overflow fp32 in the first matmuls
(1e20 x 1e20 > 3.4e38), so the first loss is NaN whatever the data.
"""

from __future__ import annotations

import math
import os

import pytest
from helpers import OVERFLOW, TINY_MODEL, read_metrics, run_cli

from megatron_gamma.training.errors import NonFiniteLossError
from megatron_gamma.training.loop import check_finite


def _run(tmp_path, demo_prefix, *flags):
    run = tmp_path / "run"
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(run), *TINY_MODEL]
    args += ["--train-iters", "2", "--eval-iters", "0", "--save", str(run / "ckpt")]
    return run, run_cli([*args, "--save-interval", "1", *OVERFLOW, *flags])


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_with_nothing_of_it_saved(tmp_path, demo_prefix):
    run, proc = _run(tmp_path, demo_prefix)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(
        "megatron-gamma pretrain: error: iteration 1: training loss nan, grad norm nan: not "
        "finite, so the run stops here (--check-for-nan-in-loss-and-grad, on by default as in "
        "Megatron-LM); this iteration is neither logged nor saved. Fix: "
    )
    assert "Traceback" not in proc.stderr
    assert read_metrics(run)["train"] == {}
    assert os.listdir(run / "ckpt") == []


@pytest.mark.slow
def test_without_the_check_a_nan_run_trains_to_its_end(tmp_path, demo_prefix):
    run, proc = _run(tmp_path, demo_prefix, "--no-check-for-nan-in-loss-and-grad")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = read_metrics(run)["train"]
    assert sorted(losses) == [1, 2] and all(math.isnan(x) for x in losses.values())
    assert sorted(os.listdir(run / "ckpt"))[:2] == ["iter_0000001", "iter_0000002"]
    with open(run / "config.yaml") as f:
        assert "check_for_nan_in_loss_and_grad: false" in f.read()


@pytest.mark.parametrize(
    "loss, grad_norm, stops",
    [(2.5, 0.3, False), (math.nan, 0.3, True), (2.5, math.inf, True), (-math.inf, 1.0, True)],
)
def test_check_finite_stops_on_a_nan_or_inf_loss_or_grad_norm(loss, grad_norm, stops):
    if not stops:
        check_finite(7, loss, grad_norm)
        return
    with pytest.raises(NonFiniteLossError, match=rf"^iteration 7: training loss {loss}, grad "):
        check_finite(7, loss, grad_norm)


def test_a_non_finite_first_loss_points_at_the_starting_weights_not_the_lr():
    """Trial 16: a NaN loss at iteration 1 (weights drawn with σ = 1e20) was told to lower the
    LR, which cannot have acted: iteration 1's loss precedes any update. Its fix names the
    starting weights; a later NaN, or a first step whose loss is finite but whose gradient
    norm is not, keeps the LR fixes."""
    with pytest.raises(NonFiniteLossError) as e:
        check_finite(1, math.nan, math.nan)
    assert "Fix: the loss of iteration 1 is computed before any update, so not the learning " in (
        str(e.value)
    )
    assert "--lr" not in str(e.value).split("Fix: ")[1].split(";")[0]
    for iteration, loss, grad_norm in ((2, math.nan, 0.3), (1, 2.5, math.inf)):
        with pytest.raises(NonFiniteLossError) as e:
            check_finite(iteration, loss, grad_norm)
        assert "Fix: a lower --lr or a longer --lr-warmup-iters" in str(e.value)

"""The tiers hold: a multi-process launch, or a ``pretrain`` process, from a test not marked
``slow`` fails by name."""

from __future__ import annotations

import pytest
from helpers import TINY_MODEL, check_nproc, check_pretrain_launch, cli_command


def test_an_unmarked_test_may_not_launch_several_processes():
    check_nproc(1)
    with pytest.raises(AssertionError, match=r"nproc=2: .*Fix: mark the test"):
        check_nproc(2)


@pytest.mark.slow
def test_a_slow_test_may_launch_several_processes():
    check_nproc(8)


def test_an_unmarked_test_may_not_start_pretrain_through_the_cli_launcher():
    assert cli_command(["evaluate", "run/checkpoints"])[-2:] == ["evaluate", "run/checkpoints"]
    check_pretrain_launch(["estimate", *TINY_MODEL])
    with pytest.raises(AssertionError, match=r"pretrain --data-path x \.\.\.: .*Fix: mark the"):
        cli_command(["pretrain", "--data-path", "x", *TINY_MODEL])


@pytest.mark.slow
def test_a_slow_test_may_start_pretrain_through_the_cli_launcher():
    assert cli_command(["pretrain", *TINY_MODEL])[-len(TINY_MODEL) - 1 :] == [
        "pretrain",
        *TINY_MODEL,
    ]

"""The tiers hold: a multi-process launch from a test not marked ``slow`` fails by name."""

from __future__ import annotations

import pytest
from helpers import check_nproc


def test_an_unmarked_test_may_not_launch_several_processes():
    check_nproc(1)
    with pytest.raises(AssertionError, match=r"nproc=2: .*Fix: mark the test"):
        check_nproc(2)


@pytest.mark.slow
def test_a_slow_test_may_launch_several_processes():
    check_nproc(8)

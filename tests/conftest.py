"""Fixtures and the test tiers.

``slow`` marks every test that launches several processes or a ``pretrain`` process
(``helpers.check_nproc`` and ``helpers.check_pretrain_launch`` fail one that does so unmarked)
and the heaviest other runs; ``pytest -m "not slow"`` is the fast tier. Shared constants and
launchers live in ``helpers.py``.
"""

from __future__ import annotations

import os

import pytest
from helpers import (  # noqa: F401  (importable from conftest for tests written against it)
    DEMO_INPUTS,
    DEMO_TOKENIZER,
    TINY_MODEL,
    close,
    pretrain,
    read_diagnostics,
    read_metrics,
    run_cli,
    set_slow_test,
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    set_slow_test(item.get_closest_marker("slow") is not None)


LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def launch_environment_unchanged():
    """A test must leave torchrun's variables as it found them: every later test that starts a
    process passes ``os.environ`` on, and a leaked MASTER_PORT makes those processes bind a port
    an earlier one still holds (EADDRINUSE)."""
    before = {var: os.environ.get(var) for var in LAUNCH_VARS}
    yield
    after = {var: os.environ.get(var) for var in LAUNCH_VARS}
    leaked = {var: after[var] for var in LAUNCH_VARS if after[var] != before[var]}
    assert not leaked, (
        f"the test changed {leaked} in os.environ (was {before}). Fix: monkeypatch.setenv / "
        "delenv them, or run the code under megatron_gamma.rundir.loader.single_process"
    )


@pytest.fixture(scope="session")
def demo_prefix(tmp_path_factory) -> str:
    """The packaged demo corpus as a Megatron dataset prefix (zh then en, one doc per line)."""
    from megatron_gamma.data.preprocess import preprocess

    out = tmp_path_factory.mktemp("demo_data") / "demo"
    return preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(out), workers=1, progress=False).prefix

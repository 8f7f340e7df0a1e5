"""Fixtures and the test tiers.

``slow`` marks every test that launches several processes (``helpers.check_nproc`` fails one
that does so unmarked) and the heaviest single-process runs; ``pytest -m "not slow"`` is the
fast tier. Shared constants and launchers live in ``helpers.py``.
"""

from __future__ import annotations

import pytest
from helpers import (  # noqa: F401  (importable from conftest for tests written against it)
    DEMO_INPUTS,
    DEMO_TOKENIZER,
    TINY_MODEL,
    allow_multi_process,
    close,
    pretrain,
    read_diagnostics,
    read_metrics,
    run_cli,
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    allow_multi_process(item.get_closest_marker("slow") is not None)


@pytest.fixture(scope="session")
def demo_prefix(tmp_path_factory) -> str:
    """The packaged demo corpus as a Megatron dataset prefix (zh then en, one doc per line)."""
    from megatron_gamma.data.preprocess import preprocess

    out = tmp_path_factory.mktemp("demo_data") / "demo"
    return preprocess(DEMO_INPUTS, DEMO_TOKENIZER, str(out), workers=1, progress=False).prefix

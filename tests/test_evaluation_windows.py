"""``evaluate``'s window counts on ``--data-path`` (``megatron_gamma/evaluation/windows.py``),
checked from a prefix's ``.idx`` without torch: the windows it allows are the windows
``token_windows`` cuts, and each refusal is the one ``evaluate`` gave after loading."""

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

from megatron_gamma.config import ConfigError
from megatron_gamma.diagnostics.compare import token_windows
from megatron_gamma.evaluation.windows import (
    DEFAULT_EVAL_TOKENS,
    allocate,
    check_data_cache_path,
    window_count,
    window_shares,
)


def _dataset(prefix: str, lengths: list[int]) -> str:
    """An indexed dataset of one document per length, token ids 0, 1, 2, ... in order."""
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(1000))
    start = 0
    for n in lengths:
        builder.add_document(np.arange(start, start + n, dtype=np.int64), [n])
        start += n
    builder.finalize(prefix + ".idx")
    return prefix


def test_the_windows_allowed_are_the_windows_token_windows_cuts(tmp_path):
    """41 tokens give (41 - 1) // 8 = 5 windows of 9 consecutive tokens: 5 are allowed, the
    sixth is refused, as ``evaluate`` refused it once ``token_windows`` had read 5."""
    prefix = _dataset(str(tmp_path / "p"), [10, 20, 11])
    assert window_shares(40, 8, [prefix], [1.0]) == [5]
    assert token_windows(prefix, 5, 8).shape == (5, 9)
    assert token_windows(prefix, 6, 8).shape == (5, 9)  # what the old check compared with 6
    with pytest.raises(ConfigError) as e:
        window_shares(48, 8, [prefix], [1.0])
    assert str(e.value) == (
        f"eval_tokens=48: {prefix} holds 5 windows of 8 tokens, its share needs 6. Fix: lower "
        "--eval-tokens or add data"
    )


def test_a_prefix_shorter_than_one_window_is_named_as_token_windows_names_it(tmp_path):
    prefix = _dataset(str(tmp_path / "p"), [10, 20, 11])
    with pytest.raises(ConfigError) as early:
        window_shares(64, 64, [prefix], [1.0])
    with pytest.raises(ConfigError) as late:
        token_windows(prefix, 1, 64)
    message = (
        f"data_path={prefix!r}: 41 tokens, fewer than one window of 65. Fix: use more data or a "
        "smaller --seq-length"
    )
    assert str(early.value) == str(late.value) == message


def test_a_blend_checks_each_prefix_against_its_share(tmp_path):
    """A share of 0 windows reads nothing of its prefix; each other share is checked."""
    big = _dataset(str(tmp_path / "big"), [100])
    small = _dataset(str(tmp_path / "small"), [17])  # (17 - 1) // 8 = 2 windows
    assert allocate(7, [0.75, 0.25]) == [5, 2]
    assert window_shares(56, 8, [big, small], [0.75, 0.25]) == [5, 2]
    assert window_shares(8, 8, [big, small], [0.75, 0.25]) == [1, 0]
    with pytest.raises(ConfigError) as e:
        window_shares(96, 8, [big, small], [0.75, 0.25])  # 12 windows: 9 and 3
    assert str(e.value).startswith(f"eval_tokens=96: {small} holds 2 windows of 8 tokens, its ")


def test_window_count_and_the_cache_path_refusals():
    assert window_count(None, 64, None) == DEFAULT_EVAL_TOKENS // 64 == 1024
    assert window_count(130, 64, 64) == 2
    with pytest.raises(ConfigError) as e:
        window_count(10, 64, None)
    assert str(e.value) == "eval_tokens=10: fewer than one window of 64 tokens. Fix: raise it"
    with pytest.raises(ConfigError) as e:
        window_count(10, 128, 64)  # the positions first, as evaluate checked them
    assert str(e.value) == (
        "seq_length=128: must lie in [1, max_position_embeddings=64]. Fix: use a shorter "
        "--seq-length"
    )
    check_data_cache_path(None, ["p"])
    for data_path, named in ((["p"], "--data-path"), (None, "the run's valid_data_path")):
        with pytest.raises(ConfigError) as e:
            check_data_cache_path("c", data_path)
        assert str(e.value) == (
            f"data_cache_path='c': acts only on the run's own validation split; windows of "
            f"{named} are read straight from the dataset, with no index cache. Fix: drop "
            "--data-cache-path"
        )

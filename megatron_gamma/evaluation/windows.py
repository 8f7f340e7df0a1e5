"""How many windows ``evaluate`` scores on ``--data-path`` or the run's ``valid_data_path``, and
the refusals of counts that cannot be scored (:func:`megatron_gamma.evaluation.evaluate.evaluate`,
cases 1 and 2).

Imports neither torch nor megatron-core (a prefix's tokens are read from its ``.idx`` with numpy:
:func:`~megatron_gamma.data.indexed.index_token_count`), so that the command line refuses these
counts before those imports wherever they depend only on its flags (``--data-path``,
``--seq-length``, ``--eval-tokens``, ``--config``): :mod:`megatron_gamma.cli`.
"""

from __future__ import annotations

import math
from typing import Optional

from megatron_gamma.config import ConfigError, RecordedPaths
from megatron_gamma.data.indexed import index_token_count, short_dataset

DEFAULT_EVAL_TOKENS = 65536
"""Tokens scored on ``--data-path`` or ``valid_data_path`` when ``eval_tokens`` is not given."""


def evaluation_blend(
    cfg, data_path: Optional[list[str]], recorded: Optional[RecordedPaths] = None
) -> tuple[list[str], list[float]]:
    """(prefixes, weights) to evaluate: ``data_path`` if given, else the run's validation blend.

    The run config is rebuilt with ``data_path`` replacing its data paths, so the blend is
    checked by :meth:`megatron_gamma.config.DataConfig.blend` (files exist, weights pair up;
    ``recorded``, where the run's relative paths were looked for, names them for the run's).

    Raises:
        ConfigError: no data path here and no ``valid_data_path`` in the run; a bad blend.
    """
    data = list(data_path or cfg.data.valid_data_path)
    if not data:
        raise ConfigError(
            "data_path=[]: nothing to evaluate on (the run has no valid_data_path, and no "
            "data_path with a split to take its validation split from). Fix: pass --data-path "
            "PREFIX (or a blend W1 P1 W2 P2 ...) of held-out data"
        )
    only = cfg.replace(data_path=data, train_data_path=[], valid_data_path=[], test_data_path=[])
    prefixes, weights = only.data.blend(None if data_path else recorded)
    weights = weights or [1.0] * len(prefixes)
    total = sum(weights)
    return prefixes, [w / total for w in weights]


def check_data_cache_path(data_cache_path: Optional[str], data_path: Optional[list[str]]) -> None:
    """Refuse ``data_cache_path`` where windows are scored (``data_path`` given, or the run's
    ``valid_data_path``): they are read straight from the dataset, with no index cache.

    Raises:
        ConfigError: ``data_cache_path`` given; names the data and the fix.
    """
    if data_cache_path is None:
        return
    named = "--data-path" if data_path else "the run's valid_data_path"
    raise ConfigError(
        f"data_cache_path={data_cache_path!r}: acts only on the run's own validation split; "
        f"windows of {named} are read straight from the dataset, with no index cache. Fix: "
        "drop --data-cache-path"
    )


def window_count(eval_tokens: Optional[int], seq: int, max_positions: Optional[int]) -> int:
    """Whole windows of ``seq`` tokens in ``eval_tokens``.

    Args:
        eval_tokens: the tokens asked for (None: :data:`DEFAULT_EVAL_TOKENS`).
        seq: the window length (``--seq-length``, else the run's ``seq_length``).
        max_positions: the run's ``max_position_embeddings`` (None: not known yet, not checked).

    Raises:
        ConfigError: ``seq`` outside ``[1, max_positions]``, or fewer than one window.
    """
    eval_tokens = DEFAULT_EVAL_TOKENS if eval_tokens is None else eval_tokens
    if max_positions is not None and not 1 <= seq <= max_positions:
        raise ConfigError(
            f"seq_length={seq}: must lie in [1, max_position_embeddings={max_positions}]. Fix: "
            "use a shorter --seq-length"
        )
    n = eval_tokens // seq
    if n < 1:
        raise ConfigError(
            f"eval_tokens={eval_tokens}: fewer than one window of {seq} tokens. Fix: raise it"
        )
    return n


def allocate(n: int, weights: list[float]) -> list[int]:
    """``n`` windows split over a blend's prefixes in proportion to ``weights`` (largest
    remainder)."""
    exact = [n * w for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def window_shares(
    eval_tokens: Optional[int], seq: int, prefixes: list[str], weights: list[float]
) -> list[int]:
    """The windows each prefix gives (:func:`allocate` of :func:`window_count`'s ``n``), each
    checked against the tokens its ``.idx`` holds: a prefix of T tokens gives
    ``(T - 1) // seq`` windows of ``seq + 1`` consecutive tokens, as
    :func:`~megatron_gamma.diagnostics.compare.token_windows` cuts them.

    Args:
        eval_tokens: the tokens asked for (None: :data:`DEFAULT_EVAL_TOKENS`).
        seq: the window length.
        prefixes: the blend's prefixes, whose files exist.
        weights: their weights, summing to 1.

    Returns:
        Windows per prefix.

    Raises:
        ConfigError: a prefix with fewer tokens than one window
            (:func:`~megatron_gamma.data.indexed.short_dataset`), or with fewer windows than its
            share (fix: lower --eval-tokens).
    """
    eval_tokens = DEFAULT_EVAL_TOKENS if eval_tokens is None else eval_tokens
    counts = allocate(eval_tokens // seq, weights)
    for prefix, count in zip(prefixes, counts, strict=True):
        tokens = index_token_count(prefix + ".idx") if count else None
        if tokens is None:  # no share, or an index megatron-core's reader names when it opens it
            continue
        if tokens < seq + 1:
            raise ConfigError(short_dataset(prefix, tokens, seq))
        have = (tokens - 1) // seq
        if have < count:
            raise ConfigError(
                f"eval_tokens={eval_tokens}: {prefix} holds {have} windows of {seq} tokens, "
                f"its share needs {count}. Fix: lower --eval-tokens or add data"
            )
    return counts

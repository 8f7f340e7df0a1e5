"""The model's vocabulary size (pure arithmetic: no torch, no megatron-core), shared by
``pretrain``, the single-rank loader and ``estimate``."""

from __future__ import annotations

from megatron_gamma.config import Config


def padded_vocab_size(vocab_size: int, cfg: Config) -> int:
    """Round the tokenizer's vocabulary up to make_vocab_size_divisible_by x TP (Megatron-LM).

    Returns:
        The smallest multiple of ``make_vocab_size_divisible_by * tensor_model_parallel_size``
        that is >= ``vocab_size`` (tokens).
    """
    multiple = cfg.model.make_vocab_size_divisible_by * cfg.parallel.tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def model_vocab_size(cfg: Config, tokenizer_vocab_size: int) -> int:
    """The model's (padded) vocabulary size, as ``pretrain`` builds it: the larger of the
    tokenizer's size and ``--vocab-size``, rounded up by :func:`padded_vocab_size`."""
    return padded_vocab_size(max(tokenizer_vocab_size, cfg.model.vocab_size or 0), cfg)

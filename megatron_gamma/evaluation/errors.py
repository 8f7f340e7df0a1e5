"""Named errors of the evaluation and Hugging Face conversion commands.

All are :class:`megatron_gamma.config.ConfigError` subclasses, so the CLI reports them as
configuration errors (exit code 2) with the "key=value: why. Fix: ..." message.
"""

from __future__ import annotations

from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.config import ConfigError

__all__ = [
    "CheckpointError",
    "DatasetUnavailableError",
    "TokenizerNotFoundError",
    "UnmappableArchitectureError",
]


class TokenizerNotFoundError(ConfigError):
    """The run's tokenizer.json (``tokenizer_model``) does not exist."""


class UnmappableArchitectureError(ConfigError):
    """The model cannot be expressed by the requested Hugging Face class."""


class DatasetUnavailableError(ConfigError):
    """An lm-eval task's dataset cannot be loaded (typically: no network, not in the cache)."""

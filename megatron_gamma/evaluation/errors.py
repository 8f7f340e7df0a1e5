"""Named errors of the benchmarks (``evaluate --tasks``).

A :class:`megatron_gamma.config.ConfigError` subclass, so the CLI reports it as a configuration
error (exit code 2) with the "key=value: why. Fix: ..." message.
"""

from __future__ import annotations

from megatron_gamma.config import ConfigError


class DatasetUnavailableError(ConfigError):
    """An lm-eval task's dataset cannot be loaded (typically: no network, not in the cache)."""

"""The configuration error and the two steps every section's validation takes: :func:`fail`
(raise a :class:`ConfigError` naming the key, the value, why and the fix) and :func:`resolve`
(store a derived or normalized value in a frozen section)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and the fix.

    ``keys``: the settings the fix asks to remove or correct; where each was set (the section
    and YAML file, or the flag) is added to the message by
    :func:`~megatron_gamma.config.loading.load_config`."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()):
        super().__init__(message)
        self.keys = keys


def fail(key: str, value: Any, why: str, fix: str, keys: tuple[str, ...] = ()) -> None:
    raise ConfigError(f"{key}={value!r}: {why}. Fix: {fix}", keys)


def resolve(section: Any, key: str, value: Any) -> None:
    """Set a derived default or normalized value of a frozen section, inside its validation
    (``__post_init__``) only: after construction every config is read-only."""
    object.__setattr__(section, key, value)

"""Megatron-LM's ``--deterministic-mode``: bit-exact reruns on GPU.

The rules are Megatron-LM's (``megatron/training/determinism.py``, which the ``megatron-core``
package does not ship): NCCL reduces in a fixed order (``NCCL_ALGO=Ring``; ``CollnetDirect``,
``CollnetChain`` and ``^NVLS`` also accepted, ``Tree`` not), cuBLAS uses a fixed workspace
(``CUBLAS_WORKSPACE_CONFIG=:4096:8`` or ``:16:8``), Transformer Engine picks no
non-deterministic algorithm (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``), torch raises on any op
without a deterministic implementation (``torch.use_deterministic_algorithms(True)``), and
megatron-core's ``TransformerConfig.deterministic_mode`` is set. A value the launcher already set
is kept when it is one of the accepted ones, and refused otherwise. megatron-gamma's own kernels
(``csrc/``) reduce in a fixed order without atomics, so they need no switch.

NCCL, cuBLAS and Transformer Engine read these variables once, when they first start (the
communicator, the handle, the first attention call): :func:`apply_deterministic_mode` runs
before ``torch.distributed`` is initialized, and :func:`check_determinism_env` (no torch import)
runs where ``pretrain`` checks its config, before any heavy import.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from megatron_gamma.config.errors import ConfigError

ENV_DEFAULTS: dict[str, str] = {
    "NCCL_ALGO": "Ring",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}
"""What :func:`apply_deterministic_mode` sets where the variable is unset."""

NCCL_ALGO_TOKENS = frozenset({"Ring", "CollnetDirect", "CollnetChain", "^NVLS"})
"""The ``NCCL_ALGO`` tokens accepted (a comma-separated list of them)."""

ENV_VALUES: dict[str, frozenset[str]] = {
    "CUBLAS_WORKSPACE_CONFIG": frozenset({":4096:8", ":16:8"}),
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": frozenset({"0"}),
}
"""The values accepted for the other variables."""


def check_determinism_env(env: MutableMapping[str, str]) -> None:
    """Refuse environment variables that would make a ``--deterministic-mode`` run
    non-deterministic; unset ones are fine (:func:`apply_deterministic_mode` sets them).

    Args:
        env: the environment (``os.environ``, or a dict in tests); read only.

    Raises:
        ConfigError: naming every bad variable, its value, the accepted values and the fix.
    """
    bad = []
    algo = env.get("NCCL_ALGO")
    if algo is not None:
        tokens = [t.strip() for t in algo.split(",") if t.strip()]
        if not tokens or not set(tokens) <= NCCL_ALGO_TOKENS:
            bad.append(f"NCCL_ALGO={algo!r} (each comma-separated token one of "
                       f"{', '.join(sorted(NCCL_ALGO_TOKENS))}; Tree's reduction order is not "
                       "fixed)")  # fmt: skip
    for name, accepted in ENV_VALUES.items():
        value = env.get(name)
        if value is not None and value not in accepted:
            bad.append(f"{name}={value!r} (accepted: {', '.join(sorted(accepted))})")
    if bad:
        raise ConfigError(
            f"deterministic_mode=True: {'; '.join(bad)} would make the run non-deterministic. "
            "Fix: unset the variable (deterministic_mode sets "
            f"{', '.join(f'{k}={v}' for k, v in ENV_DEFAULTS.items())}) or set an accepted "
            "value, or drop --deterministic-mode",
            ("deterministic_mode",),
        )


def apply_deterministic_mode(env: MutableMapping[str, str]) -> str:
    """Check ``env`` (:func:`check_determinism_env`), set each of :data:`ENV_DEFAULTS` that is
    unset, and turn on ``torch.use_deterministic_algorithms``. Call it before the first
    collective, cuBLAS call or Transformer Engine kernel; idempotent.

    Args:
        env: the environment to complete (``os.environ`` in a run).

    Returns:
        The line for the run's log: the torch switch and each variable as it now stands.

    Raises:
        ConfigError: as :func:`check_determinism_env`.
    """
    import torch

    check_determinism_env(env)
    for name, value in ENV_DEFAULTS.items():
        env.setdefault(name, value)
    torch.use_deterministic_algorithms(True)
    settings = ", ".join(f"{name}={env[name]}" for name in ENV_DEFAULTS)
    return (f"deterministic mode: torch.use_deterministic_algorithms("
            f"{torch.are_deterministic_algorithms_enabled()}), {settings}")  # fmt: skip

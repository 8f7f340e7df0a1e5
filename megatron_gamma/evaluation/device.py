"""The ``--device`` of ``evaluate --tasks``: lm-eval's device string, checked before anything
is loaded. Imports torch only when called, and never megatron-core, so that the command line
refuses a bad value at once (:mod:`megatron_gamma.cli`)."""

from __future__ import annotations

from megatron_gamma.config import ConfigError


def lm_eval_device(device: str) -> str:
    """The device string for lm-eval's ``hf`` model: ``cpu``, ``cuda`` or ``cuda:N``.

    lm-eval honours only those exact strings and runs any other on CUDA when it is available,
    else on the CPU, without a word; so a CPU or CUDA device in any spelling ``torch.device``
    reads (``cpu:0``) is written in one of those forms, and everything else is refused.

    Args:
        device: a device string, e.g. ``cpu``, ``cuda``, ``cuda:1``.

    Returns:
        ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ConfigError: a string ``torch.device`` cannot read, a device type other than cpu or
            cuda, cuda on a machine where ``torch.cuda.is_available()`` is False, or a CUDA
            index beyond ``torch.cuda.device_count()``; the message names the value and the fix.
    """
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(
            f"device={device!r}: not a device string torch reads. Fix: pass --device cpu, "
            "--device cuda or --device cuda:N (N a GPU index)"
        ) from None
    if parsed.type == "cpu":
        return "cpu"
    if parsed.type != "cuda":
        raise ConfigError(
            f"device={device!r}: evaluate runs lm-eval on cpu or cuda only. Fix: pass "
            "--device cpu or --device cuda"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r}: CUDA is not available here (torch.cuda.is_available() is "
            "False: no GPU, a CPU-only torch, or CUDA_VISIBLE_DEVICES hides the GPUs). Fix: pass "
            "--device cpu (the default), or run on a machine with a GPU"
        )
    if parsed.index is None:
        return "cuda"
    count = torch.cuda.device_count()
    if parsed.index >= count:
        raise ConfigError(
            f"device={device!r}: this machine has {count} CUDA device(s), cuda:0 to "
            f"cuda:{count - 1}. Fix: pass --device cuda:N with N < {count}, or --device cuda"
        )
    return f"cuda:{parsed.index}"

"""Fused kernels behind a stable Python API, with pure-torch fallbacks of the same contract.

``rms_norm`` and ``sigmoid_gate`` are what the model calls. They run the compiled ``csrc/``
kernels (torch custom ops ``torch.ops.megatron_gamma.*`` with autograd and fake kernels, so
``torch.compile`` traces them) when the extension ``megatron_gamma._C`` is built for the
tensor's device, and :mod:`megatron_gamma.ops.reference` otherwise; both follow the numerical
contract documented there. The extension is loaded when this module is imported (so that
``torch.compile`` never traces the loading) and one log line (logger ``megatron_gamma.ops``)
says which path was taken.

Backend choice: environment variable ``MEGATRON_GAMMA_OPS`` = ``auto`` (default: the extension
where built, else the reference), ``extension`` (an error when it is not built) or
``reference``; :func:`use_backend` overrides it within a block.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Optional

import torch

from megatron_gamma.ops.reference import rms_norm_reference, sigmoid_gate_reference

__all__ = [
    "rms_norm",
    "sigmoid_gate",
    "backend",
    "uses_cpu_kernels",
    "use_backend",
    "extension_status",
    "BACKENDS",
]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "extension", "reference")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MIN_EPS = torch.finfo(torch.float32).tiny
_BUILD_HINT = "pip install --no-build-isolation -e . (or python setup.py build_ext --inplace)"


def _check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(
            f"ops backend {name!r} (MEGATRON_GAMMA_OPS or use_backend) is not one of {BACKENDS}. "
            "Fix: pick one of them"
        )
    return name


_selected = {"backend": _check_backend(os.environ.get("MEGATRON_GAMMA_OPS", "auto"))}


def _import_extension() -> tuple[Optional[ModuleType], str]:
    """Import the extension: (the glue module or None, a status line)."""
    try:
        from megatron_gamma.ops import _fused
    except ModuleNotFoundError as e:
        if e.name != "megatron_gamma._C":
            raise
        status = (
            f"extension megatron_gamma._C is not built; using pure-torch kernels ({_BUILD_HINT})"
        )
        logger.info("megatron_gamma.ops: %s", status)
        return None, status
    except (ImportError, OSError) as e:
        status = f"extension megatron_gamma._C failed to load ({e}); using pure-torch kernels"
        logger.warning("megatron_gamma.ops: %s. Fix: rebuild it with %s", status, _BUILD_HINT)
        return None, status
    status = f"compiled kernels loaded for {', '.join(sorted(_fused.DEVICE_TYPES))}"
    logger.info("megatron_gamma.ops: %s", status)
    return _fused, status


_FUSED, _STATUS = _import_extension()


def extension_status() -> str:
    """One line: whether the compiled kernels loaded, for which devices, or why not."""
    return _STATUS


def _fused_for(device: torch.device) -> Optional[ModuleType]:
    """The compiled kernels to use for tensors on ``device``, or None for the reference."""
    choice = _selected["backend"]
    if choice == "reference":
        return None
    if _FUSED is not None and device.type in _FUSED.DEVICE_TYPES:
        return _FUSED
    if choice == "extension":
        raise RuntimeError(
            f"ops backend 'extension' requested but there are no compiled kernels for "
            f"{device.type} ({_STATUS}). Fix: build them with {_BUILD_HINT}, or set "
            f"MEGATRON_GAMMA_OPS=auto"
        )
    return None


def backend(device: torch.device | str = "cpu") -> str:
    """'extension' or 'reference': what :func:`rms_norm` and :func:`sigmoid_gate` run on
    ``device`` under the current selection."""
    return "extension" if _fused_for(torch.device(device)) is not None else "reference"


def uses_cpu_kernels(device: torch.device | str) -> bool:
    """True when ``device`` is a CPU and the compiled kernels are selected there: the condition
    for the extension's CPU-only ops (the gamma-init's ``counter_normal_`` and ``moments``)."""
    device = torch.device(device)
    return device.type == "cpu" and backend(device) == "extension"


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Select the backend ('auto', 'extension' or 'reference') inside a ``with`` block.

    Raises:
        ValueError: unknown name.
    """
    previous = _selected["backend"]
    _selected["backend"] = _check_backend(name)
    try:
        yield
    finally:
        _selected["backend"] = previous


def _check_dtype(what: str, t: torch.Tensor) -> None:
    if t.dtype not in _DTYPES:
        raise TypeError(
            f"{what} has dtype {t.dtype}. Fix: use float32, bfloat16, float16 or float64"
        )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False
) -> torch.Tensor:
    """Small-eps-safe RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w.

    Numerics (fp32 accumulation, exact power-of-two row scaling, eps never cast to x's dtype):
    :mod:`megatron_gamma.ops.reference`. Paper: "Small Initialization Matters for Large Language
    Models", RMSNorm with eps = 1e-12.

    Args:
        x: (..., hidden) float32, bfloat16, float16 or float64; any strides.
        weight: (hidden,) the gain w, or w - 1 with ``zero_centered_gamma``; any float dtype,
            on x's device.
        eps: added to the mean square; finite and >= 1.2e-38 (smallest normal fp32).
        zero_centered_gamma: the weight stores w - 1 (Transformer Engine's convention).

    Returns:
        (..., hidden), x's dtype. Differentiable in x and weight.

    Raises:
        TypeError: unsupported dtype.
        ValueError: weight shape or device not matching x, x without a hidden dimension, or
            eps out of range.
    """
    _check_dtype("rms_norm: x", x)
    _check_dtype("rms_norm: weight", weight)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"rms_norm: x of shape {tuple(x.shape)} has no hidden dimension")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"rms_norm: weight of shape {tuple(weight.shape)} does not match the hidden size "
            f"{x.shape[-1]} of x {tuple(x.shape)}. Fix: pass a ({x.shape[-1]},) weight"
        )
    if weight.device != x.device:
        raise ValueError(
            f"rms_norm: weight on {weight.device}, x on {x.device}. Fix: move both to one device"
        )
    if not (math.isfinite(eps) and eps >= _MIN_EPS):
        raise ValueError(
            f"rms_norm: eps={eps!r} must be finite and >= {_MIN_EPS:.3g} (paper: 1e-12). "
            "Fix: pass a positive eps such as 1e-12"
        )
    fused = _fused_for(x.device)
    if fused is not None:
        return fused.rms_norm(x, weight, float(eps), bool(zero_centered_gamma))
    return rms_norm_reference(x, weight, eps, zero_centered_gamma)


def sigmoid_gate(o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gated attention output y = o * sigmoid(g), sigmoid in fp32.

    Paper: "Small Initialization Matters for Large Language Models", gated attention (a sigmoid
    gate on each head's output against the attention sink).

    Args:
        o: (..., heads, head_dim) attention output; float32, bfloat16, float16 or float64.
        g: o's shape (elementwise gate) or o's shape without head_dim (headwise gate, broadcast
            over head_dim); o's dtype and device.

    Returns:
        y: o's shape and dtype. Differentiable in o and g.

    Raises:
        TypeError: unsupported dtype, or g's dtype differing from o's.
        ValueError: g's shape fits neither mode, or g on another device.
    """
    _check_dtype("sigmoid_gate: o", o)
    if g.dtype != o.dtype:
        raise TypeError(
            f"sigmoid_gate: gate dtype {g.dtype} differs from o dtype {o.dtype}. "
            "Fix: cast the gate to o's dtype"
        )
    if o.dim() < 1 or (g.shape != o.shape and g.shape != o.shape[:-1]):
        raise ValueError(
            f"sigmoid_gate: gate shape {tuple(g.shape)} fits neither o {tuple(o.shape)} "
            f"(elementwise) nor {tuple(o.shape[:-1])} (headwise). Fix: reshape the gate"
        )
    if g.device != o.device:
        raise ValueError(
            f"sigmoid_gate: gate on {g.device}, o on {o.device}. Fix: move both to one device"
        )
    fused = _fused_for(o.device)
    if fused is not None:
        return fused.sigmoid_gate(o, g)
    return sigmoid_gate_reference(o, g)

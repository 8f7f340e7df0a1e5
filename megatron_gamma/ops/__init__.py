"""Fused kernels behind a stable Python API, with pure-torch fallbacks of the same contract.

``rms_norm`` and ``sigmoid_gate`` are what the model calls. They dispatch to the compiled
``csrc/`` extension when it is built and fall back to :mod:`megatron_gamma.ops.reference`
otherwise; both sides follow the numerical contract documented there.
"""

from megatron_gamma.ops.reference import rms_norm_reference as rms_norm
from megatron_gamma.ops.reference import sigmoid_gate_reference as sigmoid_gate

__all__ = ["rms_norm", "sigmoid_gate"]

"""Evaluation of trained checkpoints: held-out loss (``evaluate``), Hugging Face export and
import (``export-hf``, ``import-hf``) and lm-evaluation-harness benchmarks with paired-bootstrap
comparisons.

Importing this package does not import ``transformers`` (the held-out loss needs no ``[eval]``
extra). :func:`register_auto_classes` registers
:class:`~megatron_gamma.evaluation.hf_model.GammaGPTConfig` and
:class:`~megatron_gamma.evaluation.hf_model.GammaGPTForCausalLM` with ``transformers``'
``AutoConfig`` / ``AutoModelForCausalLM`` (model type ``gamma_gpt``), so an exported directory
also loads without ``trust_remote_code``; importing :mod:`~megatron_gamma.evaluation.hf_export`
or taking either class from this package (``from megatron_gamma.evaluation import
GammaGPTForCausalLM``) does it.
"""

_HF_CLASSES = ("GammaGPTConfig", "GammaGPTForCausalLM")


def register_auto_classes() -> None:
    """Register the ``gamma_gpt`` classes with ``transformers``' Auto classes (idempotent).

    Raises:
        ImportError: ``transformers`` is not installed (``pip install megatron-gamma[eval]``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from megatron_gamma.evaluation.hf_model import GammaGPTConfig, GammaGPTForCausalLM

    AutoConfig.register(GammaGPTConfig.model_type, GammaGPTConfig, exist_ok=True)
    AutoModelForCausalLM.register(GammaGPTConfig, GammaGPTForCausalLM, exist_ok=True)


def __getattr__(name: str):
    if name in _HF_CLASSES:
        from megatron_gamma.evaluation import hf_model

        register_auto_classes()
        return getattr(hf_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GammaGPTConfig", "GammaGPTForCausalLM", "register_auto_classes"]

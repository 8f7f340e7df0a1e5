"""Hugging Face conversion: ``export-hf`` (:mod:`~megatron_gamma.hf.hf_export`), ``import-hf``
(:mod:`~megatron_gamma.hf.hf_import`), the weight mapping between megatron-core and
``transformers`` names (:mod:`~megatron_gamma.hf.mapping`) and the ``transformers`` class for
models no stock class expresses (:mod:`~megatron_gamma.hf.hf_model`).

The only room that imports ``transformers`` (the ``[eval]`` extra); importing this package does
not. :func:`register_auto_classes` registers :class:`~megatron_gamma.hf.hf_model.GammaGPTConfig`
and :class:`~megatron_gamma.hf.hf_model.GammaGPTForCausalLM` with ``transformers``'
``AutoConfig`` / ``AutoModelForCausalLM`` (model type ``gamma_gpt``), so an exported directory
also loads without ``trust_remote_code``; importing :mod:`~megatron_gamma.hf.hf_export` or taking
either class from this package (``from megatron_gamma.hf import GammaGPTForCausalLM``) does it.
"""

_HF_CLASSES = ("GammaGPTConfig", "GammaGPTForCausalLM")


def register_auto_classes() -> None:
    """Register the ``gamma_gpt`` classes with ``transformers``' Auto classes (idempotent).

    Raises:
        ImportError: ``transformers`` is not installed (``pip install megatron-gamma[eval]``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from megatron_gamma.hf.hf_model import GammaGPTConfig, GammaGPTForCausalLM

    AutoConfig.register(GammaGPTConfig.model_type, GammaGPTConfig, exist_ok=True)
    AutoModelForCausalLM.register(GammaGPTConfig, GammaGPTForCausalLM, exist_ok=True)


def __getattr__(name: str):
    if name in _HF_CLASSES:
        from megatron_gamma.hf import hf_model

        register_auto_classes()
        return getattr(hf_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GammaGPTConfig", "GammaGPTForCausalLM", "register_auto_classes"]

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

import contextlib
import sys
import warnings
from collections.abc import Iterator

_HF_CLASSES = ("GammaGPTConfig", "GammaGPTForCausalLM")


@contextlib.contextmanager
def bars_only_on_a_terminal() -> Iterator[None]:
    """``transformers``' tqdm bars (``Writing model shards``, ``Loading weights``) inside the
    block only when stderr is a terminal, the rule of ``pretrain``'s bar: a log file holds no
    bar. Off through ``transformers.utils.logging.disable_progress_bar`` (which turns off
    ``huggingface_hub``'s bars too), and both put back as they were after the block.

    Raises:
        ImportError: ``transformers`` is not installed (``pip install --no-build-isolation -e
            ".[eval]"``).
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    was_on, hub_was_off = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    if sys.stderr.isatty() or not was_on:
        yield
        return
    with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS set: it has the last word
        warnings.simplefilter("ignore")
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_logging.enable_progress_bar()
            if hub_was_off:
                disable_progress_bars()


def register_auto_classes() -> None:
    """Register the ``gamma_gpt`` classes with ``transformers``' Auto classes (idempotent).

    Raises:
        ImportError: ``transformers`` is not installed (``pip install --no-build-isolation -e
            ".[eval]"``).
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


__all__ = [
    "GammaGPTConfig",
    "GammaGPTForCausalLM",
    "bars_only_on_a_terminal",
    "register_auto_classes",
]

"""Evaluation of trained checkpoints: held-out loss (``evaluate``), Hugging Face export and
import (``export-hf``, ``import-hf``) and lm-evaluation-harness benchmarks with paired-bootstrap
comparisons.

Importing this package registers :class:`~megatron_gamma.evaluation.hf_model.GammaGPTConfig` and
:class:`~megatron_gamma.evaluation.hf_model.GammaGPTForCausalLM` with ``transformers``'
``AutoConfig`` / ``AutoModelForCausalLM`` (model type ``gamma_gpt``), so an exported directory
also loads without ``trust_remote_code`` in a process that imported megatron_gamma.evaluation.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from megatron_gamma.evaluation.hf_model import GammaGPTConfig, GammaGPTForCausalLM

AutoConfig.register(GammaGPTConfig.model_type, GammaGPTConfig, exist_ok=True)
AutoModelForCausalLM.register(GammaGPTConfig, GammaGPTForCausalLM, exist_ok=True)

__all__ = ["GammaGPTConfig", "GammaGPTForCausalLM"]

"""The Transformer Engine backend (``--transformer-impl transformer_engine``) and its checks.

The layers are megatron-core's TE GPT layer spec (``get_gpt_layer_with_transformer_engine_spec``):
the input norm of attention and MLP is fused into the following projection
(``TELayerNormColumnParallelLinear``: parameters ``linear_qkv.layer_norm_weight`` and
``linear_fc1.layer_norm_weight``, role 'norm' in :mod:`~megatron_gamma.model.roles`), core
attention is TE's ``TEDotProductAttention`` (choice of kernel: ``--attention-backend``), the final
norm and the q/k norms (``--qk-layernorm``) are ``TENorm``. TE's RMSNorm gets
``TransformerConfig.layernorm_epsilon`` (= ``--norm-epsilon``, 1e-12 in the paper) and
``layernorm_zero_centered_gamma`` (``--apply-layernorm-1p``); TE normalizes in fp32.

``--layer-spec gamma`` (default) adds the paper's gated attention to that spec:
:class:`~megatron_gamma.model.gated_attention.GatedSelfAttention` with its gate projection
``linear_gate`` built as a ``TELayerNormColumnParallelLinear`` too. TE's fused QKV projection
never exposes its normalized input, so the gate normalizes the residual stream itself, with its
own norm weight ``linear_gate.layer_norm_weight`` (role 'norm', initialized like the others).
At initialization this is exactly the local spec's gate (both norm weights are one); in training
the gate's input gain is a separate parameter (a reparameterization of W_g's columns, the same
function class). ``--layer-spec local`` keeps megatron-core's TE spec as shipped. The gamma-init
fills TE's parameters like the local ones (the registry matches their names).

Transformer Engine is optional: :func:`check_backend` refuses the backend by name where
megatron-core cannot import it (and FP8 where there is no FP8 GPU), before any heavy work.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from megatron_gamma.config import Config, ConfigError

FP8_CAPABILITY = {"mxfp8": (10, 0)}
"""Minimum CUDA compute capability per FP8 recipe (others: 8.9, Ada / Hopper)."""


def te_import_error() -> str:
    """Why megatron-core cannot use Transformer Engine here ('' when it can)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if gpt_layer_specs.HAVE_TE:
        return ""
    try:
        import transformer_engine  # noqa: F401
    except ImportError as e:
        return f"transformer_engine cannot be imported ({e})"
    return "megatron-core could not load its Transformer Engine extension"


def check_backend(cfg: Config, need_gpu: bool = True) -> None:
    """Refuse, by name, what this machine cannot run: ``--transformer-impl transformer_engine``
    without an importable Transformer Engine, ``--fp8-format`` without TE or without a GPU of
    compute capability >= 8.9 (10.0 for ``--fp8-recipe mxfp8``).

    Args:
        cfg: the run config.
        need_gpu: check the FP8 GPU too (False where no model runs, e.g. meta-device builds).

    Raises:
        ConfigError: naming the flag, why it cannot run here and the fix.
    """
    m = cfg.model
    if m.transformer_impl != "transformer_engine":
        return
    why = te_import_error()
    if why:
        raise ConfigError(
            f"transformer_impl='transformer_engine': {why}. Fix: install Transformer Engine "
            "(pip install transformer-engine[pytorch], on a machine with CUDA), or use "
            "--transformer-impl local"
        )
    if m.fp8_format is None or not need_gpu:
        return
    need = FP8_CAPABILITY.get(m.fp8_recipe, (8, 9))
    have = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    if have is None or have < need:
        gpu = f"compute capability {have[0]}.{have[1]}" if have else "no CUDA GPU"
        raise ConfigError(
            f"fp8_format={m.fp8_format!r}: FP8 with --fp8-recipe {m.fp8_recipe} needs a GPU of "
            f"compute capability >= {need[0]}.{need[1]}; this machine has {gpu}. Fix: drop "
            "--fp8-format (train in --bf16)"
        )


def te_modules() -> SimpleNamespace:
    """megatron-core's TE wrappers this backend builds directly: ``norm`` (``TENorm``) and
    ``layernorm_linear`` (``TELayerNormColumnParallelLinear``).

    Raises:
        ConfigError: Transformer Engine is not importable (:func:`check_backend`).
    """
    from megatron.core.models.gpt import gpt_layer_specs

    if not gpt_layer_specs.HAVE_TE:
        raise ConfigError(
            f"transformer_impl='transformer_engine': {te_import_error()}. Fix: install "
            "Transformer Engine, or use --transformer-impl local"
        )
    from megatron.core.extensions.transformer_engine import (
        TELayerNormColumnParallelLinear,
        TENorm,
    )

    return SimpleNamespace(norm=TENorm, layernorm_linear=TELayerNormColumnParallelLinear)


def te_layer_spec(cfg: Config, num_experts: Optional[int] = None):
    """megatron-core's TE GPT layer spec, with gated attention under ``--layer-spec gamma``.

    Args:
        cfg: run config.
        num_experts: experts of this layer's MoE MLP, or None for a dense MLP.

    Returns:
        (layer ModuleSpec, final norm module class ``TENorm``).

    Raises:
        ConfigError: Transformer Engine is not importable.
    """
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
    )

    from megatron_gamma.model.gated_attention import GatedSelfAttention

    te = te_modules()
    m = cfg.model
    spec = get_gpt_layer_with_transformer_engine_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=m.qk_layernorm
    )
    if m.layer_spec == "gamma" and m.gated_attention != "none":
        attention = spec.submodules.self_attention
        attention.module = GatedSelfAttention
        attention.params = dict(
            attention.params,
            granularity=m.gated_attention,
            gate_bias=m.gate_bias,
            gate_linear=te.layernorm_linear,
        )
    return spec, te.norm

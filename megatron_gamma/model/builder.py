"""Config -> megatron-core TransformerConfig -> layer specs -> GPTModel chunks."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_gamma.config import Config
from megatron_gamma.model.attention import SDPACoreAttention
from megatron_gamma.model.init import ParamInit, apply_gamma_init
from megatron_gamma.model.norm import RMSNorm


def padded_vocab_size(vocab_size: int, cfg: Config) -> int:
    """Round the tokenizer's vocabulary up to make_vocab_size_divisible_by x TP (Megatron-LM)."""
    multiple = cfg.model.make_vocab_size_divisible_by * cfg.parallel.tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def transformer_config(cfg: Config, on_gpu: bool) -> TransformerConfig:
    """The megatron-core TransformerConfig for this run.

    With ``init_method='gamma'`` megatron-core's own initialization is switched off
    (``perform_initialization=False``) and :func:`apply_gamma_init` fills every parameter;
    with ``'normal'`` megatron-core initializes as usual from ``init_method_std``.
    Fusions that need CUDA kernels are enabled only on GPU; on CPU the p2p ops are unbatched
    (batched send/recv with virtual pipelining swaps messages on gloo: silent wrong gradients).
    """
    m, p = cfg.model, cfg.parallel
    dtype = torch.bfloat16 if cfg.training.bf16 else torch.float32
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=m.swiglu,
        activation_func=F.silu if m.swiglu else F.gelu,
        add_bias_linear=m.add_bias_linear,
        attention_output_gate=m.gated_attention == "elementwise",
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        rotary_interleaved=False,
        init_method_std=cfg.init.init_method_std,
        perform_initialization=cfg.init.init_method == "normal",
        use_cpu_initialization=True,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=cfg.training.bf16,
        batch_p2p_comm=on_gpu,
        batch_p2p_sync=on_gpu,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )


def layer_spec(cfg: Config) -> ModuleSpec:
    """megatron-core's local GPT layer spec with our RMSNorm and SDPA core attention."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(module=SDPACoreAttention)
    return spec


def build_model_chunk(
    cfg: Config,
    tcfg: TransformerConfig,
    vocab_size: int,
    vp_stage: Optional[int] = None,
) -> tuple[GPTModel, dict[str, ParamInit]]:
    """Build this rank's GPTModel for one (virtual) pipeline stage and initialize it.

    Args:
        cfg: run config.
        tcfg: from :func:`transformer_config`.
        vocab_size: padded vocabulary size.
        vp_stage: virtual pipeline stage index, or None without virtual pipelining.

    Returns:
        (model, init plan {global name: ParamInit}; empty for init_method='normal').
    """
    pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    spec = layer_spec(cfg)
    n_layers = get_num_layers_to_build(tcfg, vp_stage=vp_stage)
    block = TransformerBlockSubmodules(layer_specs=[spec] * n_layers, layer_norm=RMSNorm)
    model = GPTModel(
        config=tcfg,
        transformer_layer_spec=block,
        vocab_size=vocab_size,
        max_sequence_length=cfg.model.max_position_embeddings,
        pre_process=pre,
        post_process=post,
        share_embeddings_and_output_weights=not cfg.model.untie_embeddings_and_output_weights,
        position_embedding_type=cfg.model.position_embedding_type,
        rotary_base=cfg.model.rotary_base,
        vp_stage=vp_stage,
    )
    plan = apply_gamma_init(model, cfg, vocab_size) if cfg.init.init_method == "gamma" else {}
    return model, plan

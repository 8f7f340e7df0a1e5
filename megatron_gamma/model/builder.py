"""Config -> megatron-core TransformerConfig -> layer specs -> GPTModel chunks."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from megatron_gamma.config import Config, moe_layer_pattern, virtual_stages
from megatron_gamma.model.attention import SDPACoreAttention
from megatron_gamma.model.gated_attention import GatedSelfAttention
from megatron_gamma.model.init import ParamInit, apply_gamma_init
from megatron_gamma.model.norm import RMSNorm
from megatron_gamma.model.te_backend import te_layer_spec


def skip_init(weight: torch.Tensor) -> None:
    """megatron-core init_method that leaves the weight for :func:`apply_gamma_init`."""


def transformer_config(cfg: Config, on_gpu: bool) -> TransformerConfig:
    """The megatron-core TransformerConfig for this run.

    With ``init_method='gamma'`` megatron-core's init methods are no-ops (:func:`skip_init`)
    and :func:`apply_gamma_init` fills every parameter afterwards; megatron-core still runs its
    initialization path, which tags each weight with its tensor-parallel attributes
    (``tensor_model_parallel``, ``partition_dim``) that grad-norm and checkpoint code read, and
    allocates only the local shard, on the device (``use_cpu_initialization=False``: no global
    tensor anywhere). With ``'normal'`` megatron-core initializes as usual from
    ``init_method_std`` (and scales the output layers of each block by 1/sqrt(2 num_layers)):
    on GPU from its model-parallel RNG, on CPU through ``use_cpu_initialization`` (each rank
    draws the global tensor and keeps its shard, as in Megatron-LM without a GPU). Every
    megatron-core fusion is off, on CPU and GPU (the Megatron-LM fusion switches of ModelConfig
    can only be off: :func:`~megatron_gamma.config.megatron_lm.check_fusions`); on CPU the
    pipeline p2p ops are unbatched
    (batched send/recv with virtual pipelining swaps messages on gloo: silently wrong
    gradients). Experts are split by expert parallelism and ``--expert-tensor-parallel-size``.
    ``--sequence-parallel`` at TP = 1 is dropped, as Megatron-LM does (a no-effect warning says
    so; megatron-core's TransformerConfig would refuse it).
    megatron-core's ``finalize_model_grads`` (DP/PP gradient reduction after the backward pass)
    is set here; the trainer adds only the DDP-bound ``no_sync_func`` / ``grad_sync_func``, which
    need the wrapped model (megatron-core's schedules read them from the model's config, as in
    Megatron-LM).
    """
    m, p, t = cfg.model, cfg.parallel, cfg.training
    dtype = torch.bfloat16 if t.bf16 else torch.float16 if t.fp16 else torch.float32
    moe = {}
    if m.num_experts is not None:
        moe = dict(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_token_dispatcher_type=m.moe_token_dispatcher_type,
            moe_router_load_balancing_type=m.moe_router_load_balancing_type,
            moe_z_loss_coeff=m.moe_z_loss_coeff,
            moe_router_score_function=m.moe_router_score_function,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_layer_freq=moe_layer_pattern(m.moe_layer_freq, m.num_layers),
            moe_expert_capacity_factor=m.moe_expert_capacity_factor,
            moe_pad_expert_input_to_capacity=m.moe_pad_expert_input_to_capacity,
            moe_router_dtype=m.moe_router_dtype,
            moe_grouped_gemm=False,
            expert_model_parallel_size=p.expert_model_parallel_size,
            expert_tensor_parallel_size=p.expert_tensor_parallel_size,
        )
    init = {}
    if cfg.init.init_method == "gamma":
        init = dict(
            init_method=skip_init,
            output_layer_init_method=skip_init,
            embedding_init_method=skip_init,
        )
    recompute = {}
    if t.recompute_granularity is not None:
        recompute = dict(recompute_granularity=t.recompute_granularity)
        if t.recompute_modules is not None:
            recompute.update(recompute_modules=list(t.recompute_modules))
        if t.recompute_granularity == "full":
            recompute.update(
                recompute_method=t.recompute_method, recompute_num_layers=t.recompute_num_layers
            )
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
        add_qkv_bias=m.add_qkv_bias,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        rotary_interleaved=False,
        qk_layernorm=m.qk_layernorm,
        layernorm_zero_centered_gamma=m.apply_layernorm_1p,
        attention_backend=AttnBackend[m.attention_backend],
        fp8=m.fp8_format,
        fp8_recipe=m.fp8_recipe,
        init_method_std=cfg.init.init_method_std,
        **init,
        use_cpu_initialization=not on_gpu and cfg.init.init_method == "normal",
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_stages(cfg),
        sequence_parallel=p.sequence_parallel and p.tensor_model_parallel_size > 1,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=t.bf16,
        fp16=t.fp16,
        batch_p2p_comm=on_gpu,
        batch_p2p_sync=on_gpu,
        bias_activation_fusion=m.bias_swiglu_fusion if m.swiglu else m.bias_gelu_fusion,
        bias_dropout_fusion=m.bias_dropout_fusion,
        masked_softmax_fusion=m.masked_softmax_fusion,
        gradient_accumulation_fusion=m.gradient_accumulation_fusion,
        apply_rope_fusion=m.rope_fusion,
        persist_layer_norm=m.persist_layer_norm,
        deterministic_mode=t.deterministic_mode,
        finalize_model_grads_func=finalize_model_grads,
        **moe,
        **recompute,
    )


def layer_spec(cfg: Config, moe: Optional[bool] = None) -> tuple[ModuleSpec, type]:
    """The transformer layer spec and the final norm's module class.

    ``transformer_impl='transformer_engine'``: megatron-core's TE spec
    (:func:`~megatron_gamma.model.te_backend.te_layer_spec`). ``'local'``: megatron-core's local
    GPT layer spec with our RMSNorm (also on q and k with ``qk_layernorm``), SDPA core attention
    and gates; ``gated_attention='none'`` keeps megatron-core's ``SelfAttention``, otherwise
    :class:`GatedSelfAttention` with the chosen granularity replaces it through the spec.
    ``layer_spec='local'`` returns megatron-core's spec unchanged (same parameter names). The
    final norm is the layers' norm class. ``moe`` picks an MoE (True) or dense (False) MLP;
    default: MoE when ``--num-experts`` is set (``--moe-layer-freq`` mixes the two, see
    :func:`build_model_chunk`).

    Raises:
        ConfigError: the TE backend where Transformer Engine is not importable.
    """
    m = cfg.model
    moe = m.num_experts is not None if moe is None else moe
    num_experts = m.num_experts if moe else None
    if m.transformer_impl == "transformer_engine":
        return te_layer_spec(cfg, num_experts)
    spec = get_gpt_layer_local_spec(
        num_experts=num_experts, normalization="RMSNorm", qk_layernorm=m.qk_layernorm
    )
    if m.layer_spec == "local":
        return spec, spec.submodules.input_layernorm
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    attention = spec.submodules.self_attention
    attention.submodules.core_attention = ModuleSpec(module=SDPACoreAttention)
    if m.qk_layernorm:
        attention.submodules.q_layernorm = RMSNorm
        attention.submodules.k_layernorm = RMSNorm
    if m.gated_attention != "none":
        attention.module = GatedSelfAttention
        attention.params = dict(
            attention.params, granularity=m.gated_attention, gate_bias=m.gate_bias
        )
    return spec, RMSNorm


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
        (model, init plan {local parameter name: ParamInit}; empty for init_method='normal').
    """
    pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    n_layers = get_num_layers_to_build(tcfg, vp_stage=vp_stage)
    if cfg.model.num_experts is None:
        spec, norm = layer_spec(cfg)
        specs = [spec] * n_layers
    else:  # megatron-core's moe_layer_freq: 1 = MoE, 0 = dense, per global layer
        offset = get_transformer_layer_offset(tcfg, vp_stage=vp_stage)
        pattern = moe_layer_pattern(cfg.model.moe_layer_freq, cfg.model.num_layers)
        kinds = {True: layer_spec(cfg, moe=True), False: layer_spec(cfg, moe=False)}
        specs = [kinds[bool(pattern[offset + i])][0] for i in range(n_layers)]
        norm = kinds[True][1]
    block = TransformerBlockSubmodules(layer_specs=specs, layer_norm=norm)
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
        rotary_percent=cfg.model.rotary_percent,
        vp_stage=vp_stage,
    )
    plan = apply_gamma_init(model, cfg, vocab_size) if cfg.init.init_method == "gamma" else {}
    return model, plan


def build_model(
    cfg: Config, tcfg: TransformerConfig, vocab_size: int
) -> tuple[list[GPTModel], dict[str, ParamInit]]:
    """All model chunks of this rank (one per virtual pipeline stage) and their init plans.

    Plans are keyed ``chunk{i}.{local name}``.
    """
    chunks, plans = [], {}
    vpp = virtual_stages(cfg)
    for i, stage in enumerate(range(vpp) if vpp else [None]):
        model, plan = build_model_chunk(cfg, tcfg, vocab_size, vp_stage=stage)
        chunks.append(model)
        plans.update({f"chunk{i}.{name}": init for name, init in plan.items()})
    return chunks, plans

"""Weight and config mapping between megatron-core GPTModel and Hugging Face causal LMs.

megatron-core names (single-rank ``GPTModel.state_dict()``, the global tensors of a torch_dist
checkpoint) against Hugging Face names (``LlamaForCausalLM`` and
:class:`megatron_gamma.hf.hf_model.GammaGPTForCausalLM`, which share them):

=================================================  ===============================================
megatron-core                                      Hugging Face
=================================================  ===============================================
embedding.word_embeddings.weight (V, H)            model.embed_tokens.weight
decoder.layers.i.input_layernorm.weight            model.layers.i.input_layernorm.weight
decoder.layers.i.self_attention.linear_qkv.weight  q_proj / k_proj / v_proj (split per group, below)
decoder.layers.i.self_attention.linear_gate.*      model.layers.i.self_attn.gate_proj.*
decoder.layers.i.self_attention.linear_proj.weight model.layers.i.self_attn.o_proj.weight
decoder.layers.i.pre_mlp_layernorm.weight          model.layers.i.post_attention_layernorm.weight
decoder.layers.i.mlp.linear_fc1.weight (2F, H)     gate_proj: rows [0, F); up_proj: [F, 2F)
decoder.layers.i.mlp.linear_fc2.weight             mlp.down_proj.weight
decoder.layers.i.mlp.router.weight (E, H)          mlp.router.weight
decoder.layers.i.mlp.experts.local_experts.e.*     mlp.experts.e.* (as the dense MLP)
decoder.final_layernorm.weight                     model.norm.weight
output_layer.weight (untied only)                  lm_head.weight
=================================================  ===============================================

``linear_qkv`` rows are grouped by key-value group (megatron-core
``SelfAttention.get_query_key_value_tensors``): for each of the g groups, the n/g query heads'
rows, then that group's key rows, then its value rows, d rows per head. SwiGLU ``linear_fc1``
holds [gate; up] (megatron-core applies silu to the first half). Both directions are exact
reshapes: a round trip returns bit-identical tensors. The splits are the weight-role registry's
(:func:`~megatron_gamma.model.roles.qkv_parts`, :func:`~megatron_gamma.model.roles.glu_parts`),
the same the diagnostics report as ``qkv.q/k/v`` and ``fc1.gate/up``.
"""

from __future__ import annotations

import torch

from megatron_gamma.config import Config, ConfigError, ModelConfig
from megatron_gamma.config.megatron_lm import moe_layer_pattern
from megatron_gamma.model.roles import glu_parts, qkv_parts


class UnmappableArchitectureError(ConfigError):
    """The model cannot be expressed by the requested Hugging Face class."""


_ATTN = "decoder.layers.{i}.self_attention"
_MLP = "decoder.layers.{i}.mlp"


def unsupported_features(cfg: Config) -> list[str]:
    """Features of ``cfg`` that no Hugging Face class here expresses (empty: exportable)."""
    m = cfg.model
    out = []
    if m.position_embedding_type != "rope":
        out.append(f"position_embedding_type={m.position_embedding_type!r} (only 'rope')")
    if not m.swiglu:
        out.append("swiglu=False (only SwiGLU MLPs)")
    if m.add_bias_linear:
        out.append("add_bias_linear=True (no linear biases)")
    if m.rotary_percent != 1.0:
        out.append(f"rotary_percent={m.rotary_percent} (only full RoPE)")
    if m.qk_layernorm:
        out.append("qk_layernorm=True (no q/k norms)")
    if m.apply_layernorm_1p:
        out.append("apply_layernorm_1p=True (norm weights store the gain itself)")
    if m.transformer_impl != "local":
        out.append(f"transformer_impl={m.transformer_impl!r} (local parameter names only)")
    if m.num_experts is not None:  # GammaMoE: every layer MoE, top-k then softmax, dropless
        if 0 in moe_layer_pattern(m.moe_layer_freq, m.num_layers):
            out.append(f"moe_layer_freq={m.moe_layer_freq!r} (only every layer MoE)")
        if m.moe_shared_expert_intermediate_size is not None:
            size = m.moe_shared_expert_intermediate_size
            out.append(f"moe_shared_expert_intermediate_size={size} (no shared experts)")
        if m.moe_router_score_function != "softmax":
            out.append(
                f"moe_router_score_function={m.moe_router_score_function!r} (only softmax over "
                "the top-k)"
            )
        if m.moe_expert_capacity_factor is not None:
            out.append(
                f"moe_expert_capacity_factor={m.moe_expert_capacity_factor} (dropless only: "
                "megatron-core drops tokens past capacity at evaluation too)"
            )
    return out


def stock_blockers(cfg: Config) -> list[str]:
    """Why ``cfg`` needs our model class instead of ``LlamaForCausalLM`` (empty: Llama fits)."""
    m = cfg.model
    out = []
    if m.gated_attention != "none":
        out.append(f"gated_attention={m.gated_attention!r}")
    if m.num_experts is not None:
        out.append(f"num_experts={m.num_experts} (MoE)")
    return out


def check_mappable(cfg: Config, hf_format: str) -> str:
    """The Hugging Face model type for ``cfg``: 'llama' or 'gamma_gpt'.

    Args:
        cfg: the run's config.
        hf_format: 'auto' (Llama when it fits exactly, else ours), 'llama' (stock class only,
            no custom code) or 'gamma_gpt' (always ours).

    Raises:
        UnmappableArchitectureError: a feature no class here expresses, or 'llama' asked for a
            gated-attention or MoE model.
        ValueError: unknown ``hf_format``.
    """
    if hf_format not in ("auto", "llama", "gamma_gpt"):
        raise ValueError(f"hf_format={hf_format!r}: use 'auto', 'llama' or 'gamma_gpt'")
    bad = unsupported_features(cfg)
    if bad:
        raise UnmappableArchitectureError(
            f"model={'; '.join(bad)}: no Hugging Face mapping for this architecture. Fix: export "
            "a run trained with megatron-gamma's defaults for these (full RoPE, SwiGLU, no "
            "linear biases, no q/k norms, plain norm weights, --transformer-impl local; for MoE "
            "every layer MoE, softmax routing, no shared experts, no capacity factor)"
        )
    blockers = stock_blockers(cfg)
    if hf_format == "llama" and blockers:
        raise UnmappableArchitectureError(
            f"hf_format='llama': {', '.join(blockers)} has no stock transformers class "
            "(LlamaForCausalLM has neither attention output gates nor MoE layers). Fix: use "
            "--hf-format auto, which exports megatron-gamma's GammaGPTForCausalLM "
            "(loaded with trust_remote_code=True)"
        )
    if hf_format == "gamma_gpt" or blockers:
        return "gamma_gpt"
    return "llama"


def hf_config_kwargs(cfg: Config, vocab_size: int, model_type: str) -> dict:
    """Keyword arguments of ``LlamaConfig`` or ``GammaGPTConfig`` for ``cfg``."""
    m = cfg.model
    common = dict(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups,
        head_dim=m.kv_channels,
        max_position_embeddings=m.max_position_embeddings,
        rms_norm_eps=m.norm_epsilon,
        tie_word_embeddings=not m.untie_embeddings_and_output_weights,
    )
    if model_type == "llama":
        return dict(
            common,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": float(m.rotary_base)},
        )
    return dict(
        common,
        rope_theta=float(m.rotary_base),
        gated_attention=m.gated_attention,
        gate_bias=m.gate_bias,
        num_experts=m.num_experts,
        num_experts_per_tok=m.moe_router_topk,
        moe_intermediate_size=m.moe_ffn_hidden_size,
    )


def _default_rope(rope) -> bool:
    """Whether a ``rope_parameters`` or ``rope_scaling`` value of config.json is plain RoPE.

    transformers reads either key (``rope_scaling`` from configs transformers 4.x saved, e.g.
    Llama-3.1's ``{"rope_type": "llama3", "factor": 8.0, ...}``) and takes the type from
    ``rope_type``, else from the older ``type``; anything but 'default' (llama3, linear, dynamic,
    yarn, longrope, ...) or a ``partial_rotary_factor`` below 1 is RoPE megatron-gamma does not
    build."""
    if not rope:
        return True
    if not isinstance(rope, dict):
        return False
    return all(rope.get(k, "default") == "default" for k in ("rope_type", "type")) and rope.get(
        "partial_rotary_factor"
    ) in (None, 1, 1.0)


def _rope_theta(hf: dict) -> float:
    """The RoPE base transformers reads from ``hf``: ``rope_scaling`` takes the place of
    ``rope_parameters`` when given; a ``rope_theta`` in neither falls back to the top-level one,
    then to 10000."""
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    for theta in (rope.get("rope_theta"), hf.get("rope_theta")):
        if theta is not None:
            return theta
    return 10000.0


def model_section_from_hf(hf: dict) -> dict:
    """The ``model`` section of a megatron-gamma config from a Hugging Face ``config.json``.

    Raises:
        UnmappableArchitectureError: a model type other than 'llama' / 'gamma_gpt', or Llama
            options megatron-gamma does not build (biases, non-default RoPE given as
            ``rope_parameters`` or ``rope_scaling``, partial rotary, non-silu MLP).
    """
    kind = hf.get("model_type")
    if kind not in ("llama", "gamma_gpt"):
        raise UnmappableArchitectureError(
            f"model_type={kind!r}: import-hf reads 'llama' and 'gamma_gpt' models. Fix: convert "
            "a model exported by `megatron-gamma export-hf` or a Llama checkpoint"
        )
    bad = [
        f"{k}={hf.get(k)!r}"
        for k, ok in (
            ("attention_bias", not hf.get("attention_bias", False)),
            ("mlp_bias", not hf.get("mlp_bias", False)),
            ("hidden_act", hf.get("hidden_act", "silu") == "silu"),
            ("rope_parameters", _default_rope(hf.get("rope_parameters"))),
            ("rope_scaling", _default_rope(hf.get("rope_scaling"))),
            ("partial_rotary_factor", hf.get("partial_rotary_factor") in (None, 1, 1.0)),
        )
        if not ok
    ]
    if bad:
        raise UnmappableArchitectureError(
            f"{', '.join(bad)}: megatron-gamma builds bias-free SiLU-gated models with default "
            "RoPE. Fix: import a model without these options"
        )
    heads = hf["num_attention_heads"]
    section = dict(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads,
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads,
        seq_length=hf["max_position_embeddings"],
        max_position_embeddings=hf["max_position_embeddings"],
        norm_epsilon=hf["rms_norm_eps"],
        rotary_base=int(_rope_theta(hf)),
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
        gated_attention=hf.get("gated_attention", "none"),
        gate_bias=hf.get("gate_bias", False),
        swiglu=True,
        add_bias_linear=False,
        position_embedding_type="rope",
    )
    if hf.get("num_experts"):
        section.update(
            num_experts=hf["num_experts"],
            moe_router_topk=hf["num_experts_per_tok"],
            moe_ffn_hidden_size=hf["moe_intermediate_size"],
        )
    return section


def _qkv_join(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: Config) -> torch.Tensor:
    m = cfg.model
    g, d = m.num_query_groups, m.kv_channels
    per = m.num_attention_heads // g
    h = q.size(-1)
    grouped = torch.cat(
        [q.view(g, per, d, h), k.view(g, 1, d, h), v.view(g, 1, d, h)], dim=1
    )  # (g, n/g + 2, d, H)
    return grouped.reshape(-1, h)


def _mlp_to_hf(sd: dict, src: str, dst: str, out: dict, m: ModelConfig) -> None:
    halves = glu_parts(sd[f"{src}.linear_fc1.weight"], m)
    out[f"{dst}.gate_proj.weight"] = halves["gate"].contiguous()
    out[f"{dst}.up_proj.weight"] = halves["up"].contiguous()
    out[f"{dst}.down_proj.weight"] = sd[f"{src}.linear_fc2.weight"]


def _mlp_from_hf(sd: dict, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.linear_fc1.weight"] = torch.cat(
        [sd[f"{src}.gate_proj.weight"], sd[f"{src}.up_proj.weight"]], dim=0
    )
    out[f"{dst}.linear_fc2.weight"] = sd[f"{src}.down_proj.weight"]


def to_hf(sd: dict[str, torch.Tensor], cfg: Config) -> dict[str, torch.Tensor]:
    """Hugging Face tensors from a single-rank megatron-core ``GPTModel.state_dict()``.

    ``_extra_state`` entries are dropped; tied models get no ``lm_head.weight``.
    """
    m = cfg.model
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"]}
    for i in range(m.num_layers):
        a, mlp, hf = _ATTN.format(i=i), _MLP.format(i=i), f"model.layers.{i}"
        out[f"{hf}.input_layernorm.weight"] = sd[f"decoder.layers.{i}.input_layernorm.weight"]
        qkv = qkv_parts(sd[f"{a}.linear_qkv.weight"], m)
        for x in "qkv":
            out[f"{hf}.self_attn.{x}_proj.weight"] = qkv[x]
        out[f"{hf}.self_attn.o_proj.weight"] = sd[f"{a}.linear_proj.weight"]
        if m.gated_attention != "none":
            out[f"{hf}.self_attn.gate_proj.weight"] = sd[f"{a}.linear_gate.weight"]
            if m.gate_bias:
                out[f"{hf}.self_attn.gate_proj.bias"] = sd[f"{a}.linear_gate.bias"]
        out[f"{hf}.post_attention_layernorm.weight"] = sd[
            f"decoder.layers.{i}.pre_mlp_layernorm.weight"
        ]
        if m.num_experts is None:
            _mlp_to_hf(sd, mlp, f"{hf}.mlp", out, m)
        else:
            out[f"{hf}.mlp.router.weight"] = sd[f"{mlp}.router.weight"]
            for e in range(m.num_experts):
                _mlp_to_hf(sd, f"{mlp}.experts.local_experts.{e}", f"{hf}.mlp.experts.{e}", out, m)
    out["model.norm.weight"] = sd["decoder.final_layernorm.weight"]
    if m.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = sd["output_layer.weight"]
    return out


def from_hf(sd: dict[str, torch.Tensor], cfg: Config) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hf`: megatron-core tensor names (no ``_extra_state``)."""
    m = cfg.model
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"]}
    for i in range(m.num_layers):
        a, mlp, hf = _ATTN.format(i=i), _MLP.format(i=i), f"model.layers.{i}"
        out[f"decoder.layers.{i}.input_layernorm.weight"] = sd[f"{hf}.input_layernorm.weight"]
        out[f"{a}.linear_qkv.weight"] = _qkv_join(
            *(sd[f"{hf}.self_attn.{p}_proj.weight"] for p in "qkv"), cfg
        )
        out[f"{a}.linear_proj.weight"] = sd[f"{hf}.self_attn.o_proj.weight"]
        if m.gated_attention != "none":
            out[f"{a}.linear_gate.weight"] = sd[f"{hf}.self_attn.gate_proj.weight"]
            if m.gate_bias:
                out[f"{a}.linear_gate.bias"] = sd[f"{hf}.self_attn.gate_proj.bias"]
        out[f"decoder.layers.{i}.pre_mlp_layernorm.weight"] = sd[
            f"{hf}.post_attention_layernorm.weight"
        ]
        if m.num_experts is None:
            _mlp_from_hf(sd, f"{hf}.mlp", mlp, out)
        else:
            out[f"{mlp}.router.weight"] = sd[f"{hf}.mlp.router.weight"]
            for e in range(m.num_experts):
                _mlp_from_hf(sd, f"{hf}.mlp.experts.{e}", f"{mlp}.experts.local_experts.{e}", out)
    out["decoder.final_layernorm.weight"] = sd["model.norm.weight"]
    if m.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = sd["lm_head.weight"]
    return out

"""Weight and config mapping between megatron-core GPTModel and Hugging Face causal LMs.

megatron-core names (single-rank ``GPTModel.state_dict()``, the global tensors of a torch_dist
checkpoint) against Hugging Face names (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM`` and :class:`megatron_gamma.hf.hf_model.GammaGPTForCausalLM`, which share
them):

=================================================  ===============================================
megatron-core                                      Hugging Face
=================================================  ===============================================
embedding.word_embeddings.weight (V, H)            model.embed_tokens.weight
decoder.layers.i.input_layernorm.weight            model.layers.i.input_layernorm.weight
decoder.layers.i.self_attention.linear_qkv.weight  q_proj / k_proj / v_proj (split per group, below)
decoder.layers.i.self_attention.linear_qkv.bias    q/k/v_proj.bias (Qwen2; grouped as the weight)
decoder.layers.i.self_attention.q_layernorm.weight model.layers.i.self_attn.q_norm.weight (Qwen3)
decoder.layers.i.self_attention.k_layernorm.weight model.layers.i.self_attn.k_norm.weight (Qwen3)
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

Import (:func:`from_hf`) also reads Qwen2 and Qwen3, whose layouts are Llama's plus, for Qwen2,
biases on q/k/v only (megatron-core ``add_qkv_bias``) and, for Qwen3, an RMSNorm over each head's
query and key before RoPE, eps ``rms_norm_eps``, one weight of ``head_dim`` shared by the heads
(megatron-core ``qk_layernorm``: ``q_layernorm`` / ``k_layernorm`` on the ``(s, b, heads,
head_dim)`` query and key, before RoPE, eps ``layernorm_epsilon``; here our RMSNorm, the same
x / sqrt(mean(x^2) + eps) * w in fp32 as transformers' ``Qwen3RMSNorm``). Export
(:func:`to_hf`) writes neither: :func:`unsupported_features` refuses those runs.
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
    if m.add_qkv_bias:
        out.append("add_qkv_bias=True (no q/k/v biases)")
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
            "linear or q/k/v biases, no q/k norms, plain norm weights, --transformer-impl local; "
            "for MoE every layer MoE, softmax routing, no shared experts, no capacity factor)"
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


IMPORT_TYPES = ("llama", "qwen2", "qwen3", "gamma_gpt")
"""The ``model_type`` values of ``config.json`` that import-hf reads."""

_REFUSED_TYPES = {
    "qwen2_moe": "Qwen2-MoE, a mixture of experts with a gated shared expert",
    "qwen3_moe": "Qwen3-MoE, a mixture of experts",
}
"""Why import-hf refuses model types near the ones it reads."""


def _full_attention(hf: dict) -> list[str]:
    """The settings of a Qwen ``config.json`` ``hf`` that give some layer sliding-window
    attention (megatron-gamma builds full causal attention in every layer): ``use_sliding_window``
    (transformers then slides the window on the layers from ``max_window_layers`` on) and a
    ``layer_types`` entry other than 'full_attention'."""
    bad = []
    if hf.get("use_sliding_window"):
        bad.append(
            f"use_sliding_window={hf['use_sliding_window']!r} (sliding_window="
            f"{hf.get('sliding_window')!r} from layer max_window_layers="
            f"{hf.get('max_window_layers')!r})"
        )
    types = hf.get("layer_types") or []
    if any(t != "full_attention" for t in types):
        bad.append(f"layer_types={types!r} (only 'full_attention')")
    return bad


def model_section_from_hf(hf: dict) -> dict:
    """The ``model`` section of a megatron-gamma config from a Hugging Face ``config.json``.

    'llama' and 'gamma_gpt' map onto the Llama layout; 'qwen2' adds ``add_qkv_bias`` (its q/k/v
    projections always have biases) and 'qwen3' ``qk_layernorm`` (its ``q_norm`` / ``k_norm``;
    ``head_dim`` defaults to 128 as ``Qwen3Config``'s does). Tied embeddings
    (``tie_word_embeddings``) and the RoPE base (:func:`_rope_theta`) are read alike for all.

    Raises:
        UnmappableArchitectureError: a model type outside :data:`IMPORT_TYPES` (the MoE Qwen
            types with their reason), or options megatron-gamma does not build: linear biases
            (``attention_bias``, ``mlp_bias``), non-default RoPE given as ``rope_parameters`` or
            ``rope_scaling``, partial rotary, a non-silu MLP, sliding-window attention
            (``use_sliding_window``, ``layer_types``); each named with its value.
    """
    kind = hf.get("model_type")
    if kind not in IMPORT_TYPES:
        why = f" ({_REFUSED_TYPES[kind]}: no weight mapping here)" if kind in _REFUSED_TYPES else ""
        raise UnmappableArchitectureError(
            f"model_type={kind!r}{why}: import-hf reads 'llama', 'qwen2', 'qwen3' and "
            "'gamma_gpt' models. Fix: convert a model exported by `megatron-gamma export-hf`, a "
            "Llama, or a dense Qwen2/Qwen3 checkpoint"
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
    if kind in ("qwen2", "qwen3"):
        bad += _full_attention(hf)
    if bad:
        raise UnmappableArchitectureError(
            f"{', '.join(bad)}: megatron-gamma builds SiLU-gated models with full causal "
            "attention, default RoPE and no linear biases (q/k/v biases as Qwen2 has them). Fix: "
            "import a model without these options"
        )
    heads = hf["num_attention_heads"]
    head_dim = 128 if kind == "qwen3" else hf["hidden_size"] // heads
    section = dict(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads,
        kv_channels=hf.get("head_dim") or head_dim,
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
    if kind == "qwen2":
        section.update(add_qkv_bias=True)
    if kind == "qwen3":
        section.update(qk_layernorm=True)
    if hf.get("num_experts"):
        section.update(
            num_experts=hf["num_experts"],
            moe_router_topk=hf["num_experts_per_tok"],
            moe_ffn_hidden_size=hf["moe_intermediate_size"],
        )
    return section


def _qkv_join(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: Config) -> torch.Tensor:
    """megatron-core's fused QKV rows from HF's q, k and v projections: weights (rows, H) or
    biases (rows,), grouped per key-value group as :func:`~megatron_gamma.model.roles.qkv_parts`
    splits them."""
    m = cfg.model
    g, d = m.num_query_groups, m.kv_channels
    per = m.num_attention_heads // g
    rest = q.shape[1:]
    grouped = torch.cat(
        [q.view(g, per * d, *rest), k.view(g, d, *rest), v.view(g, d, *rest)], dim=1
    )  # (g, (n/g + 2) d, ...)
    return grouped.reshape(-1, *rest)


def _mlp_to_hf(sd: dict, src: str, dst: str, out: dict, m: ModelConfig) -> None:
    halves = glu_parts(sd[f"{src}.linear_fc1.weight"], m)
    out[f"{dst}.gate_proj.weight"] = halves["gate"].contiguous()
    out[f"{dst}.up_proj.weight"] = halves["up"].contiguous()
    out[f"{dst}.down_proj.weight"] = sd[f"{src}.linear_fc2.weight"]


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


def _import_plan(cfg: Config) -> list[tuple[str, list[str]]]:
    """(megatron-core name, the Hugging Face names it is made of) for every tensor of ``cfg``'s
    model, in :func:`from_hf`'s order: one name is the tensor itself; three (q, k, v) are joined
    by :func:`_qkv_join`; two (gate, up) are stacked into a SwiGLU fc1."""
    m = cfg.model
    plan = [("embedding.word_embeddings.weight", ["model.embed_tokens.weight"])]

    def mlp(src: str, dst: str) -> None:
        plan.append(
            (f"{dst}.linear_fc1.weight", [f"{src}.gate_proj.weight", f"{src}.up_proj.weight"])
        )
        plan.append((f"{dst}.linear_fc2.weight", [f"{src}.down_proj.weight"]))

    for i in range(m.num_layers):
        a, dst, hf = _ATTN.format(i=i), _MLP.format(i=i), f"model.layers.{i}"
        attn = f"{hf}.self_attn"
        plan.append(
            (f"decoder.layers.{i}.input_layernorm.weight", [f"{hf}.input_layernorm.weight"])
        )
        plan.append((f"{a}.linear_qkv.weight", [f"{attn}.{p}_proj.weight" for p in "qkv"]))
        if m.add_qkv_bias:
            plan.append((f"{a}.linear_qkv.bias", [f"{attn}.{p}_proj.bias" for p in "qkv"]))
        if m.qk_layernorm:
            plan.append((f"{a}.q_layernorm.weight", [f"{attn}.q_norm.weight"]))
            plan.append((f"{a}.k_layernorm.weight", [f"{attn}.k_norm.weight"]))
        plan.append((f"{a}.linear_proj.weight", [f"{attn}.o_proj.weight"]))
        if m.gated_attention != "none":
            plan.append((f"{a}.linear_gate.weight", [f"{attn}.gate_proj.weight"]))
            if m.gate_bias:
                plan.append((f"{a}.linear_gate.bias", [f"{attn}.gate_proj.bias"]))
        plan.append(
            (
                f"decoder.layers.{i}.pre_mlp_layernorm.weight",
                [f"{hf}.post_attention_layernorm.weight"],
            )
        )
        if m.num_experts is None:
            mlp(f"{hf}.mlp", dst)
        else:
            plan.append((f"{dst}.router.weight", [f"{hf}.mlp.router.weight"]))
            for e in range(m.num_experts):
                mlp(f"{hf}.mlp.experts.{e}", f"{dst}.experts.local_experts.{e}")
    plan.append(("decoder.final_layernorm.weight", ["model.norm.weight"]))
    if m.untie_embeddings_and_output_weights:
        plan.append(("output_layer.weight", ["lm_head.weight"]))
    return plan


def _listed(names: list[str]) -> str:
    """The first 8 of ``names`` and their count, for a message; 'none' for none."""
    more = f", ... ({len(names)} in all)" if len(names) > 8 else ""
    return ", ".join(names[:8]) + more if names else "none"


class WeightsMismatchError(ValueError):
    """Hugging Face tensors that are not the ones ``config.json`` describes."""


IGNORED_HF_TENSORS = (".rotary_emb.inv_freq",)
"""Name endings of tensors some Hugging Face checkpoints hold that are not weights: RoPE's
inverse frequencies, a buffer that older transformers saved and that the model recomputes."""


def from_hf(sd: dict[str, torch.Tensor], cfg: Config) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hf`, and the import of Qwen2's q/k/v biases and Qwen3's q/k
    norms (module docstring): megatron-core tensor names (no ``_extra_state``).

    Args:
        sd: every tensor of the Hugging Face model (a tied model's ``lm_head.weight`` removed).
        cfg: the config :func:`model_section_from_hf` gave.

    Raises:
        WeightsMismatchError: tensors ``cfg`` asks for are missing from ``sd``, or ``sd`` holds
            tensors the mapping places nowhere (but :data:`IGNORED_HF_TENSORS`), e.g. biases of
            a model whose config.json says it has none: ``missing: NAMES; not in it: NAMES``
            (8 names each, and the count). Checked before any tensor is copied.
    """
    plan = _import_plan(cfg)
    needed = {name for _, names in plan for name in names}
    missing = sorted(needed - set(sd))
    unused = sorted(k for k in set(sd) - needed if not k.endswith(IGNORED_HF_TENSORS))
    if missing or unused:
        raise WeightsMismatchError(f"missing: {_listed(missing)}; not in it: {_listed(unused)}")
    out = {}
    for mc, names in plan:
        parts = [sd[name] for name in names]
        if len(parts) == 3:
            out[mc] = _qkv_join(*parts, cfg)
        elif len(parts) == 2:
            out[mc] = torch.cat(parts, dim=0)
        else:
            out[mc] = parts[0]
    return out

"""Megatron-LM model flags on real megatron-core GPTModels built by ``model.builder``.

References: closed forms in fp64 (the K/V projection sizes of grouped-query attention, the RoPE
rotation of the first ``rotary_percent`` of each head's channels, RMSNorm of q and k, the
zero-centered norm y = x_hat * (1 + w)), computed from the model's own weights and the inputs it
received (forward hooks). Models are built in a spawned process (megatron_gamma.parallel
installs process-wide CPU shims).
"""

from __future__ import annotations

import pytest
import torch
from distributed import run_distributed
from helpers import TINY

from megatron_gamma.config import ConfigError, load_config

BASE = TINY
S, B, HN = 16, 2, 16


def _capture(model, tokens):
    """Run ``model`` on ``tokens``; return layer 0's linear_qkv output and the q, k given to its
    core attention."""
    attention = model.decoder.layers[0].self_attention
    seen = {}

    def post(m, args, out):
        seen["qkv"] = out[0].detach().double()

    def pre(m, args, kwargs):
        seen["query"], seen["key"] = (t.detach().double() for t in args[:2])

    h1 = attention.linear_qkv.register_forward_hook(post)
    h2 = attention.core_attention.register_forward_pre_hook(pre, with_kwargs=True)
    positions = torch.arange(S).expand(B, -1)
    with torch.no_grad():
        model(tokens, positions, None)
    h1.remove()
    h2.remove()
    return seen


def _split_qkv(qkv, heads, groups):
    """megatron-core's fused QKV rows per query group ``[q (heads/groups), k, v]``."""
    per = heads // groups
    mixed = qkv.view(S, B, groups, (per + 2) * HN)
    q, k, v = mixed.split([per * HN, HN, HN], dim=-1)
    return q.reshape(S, B, heads, HN), k, v


def _rope64(x, rotary_percent, base=10000.0):
    """fp64 RoPE (non-interleaved) of the first int(HN * rotary_percent) channels, positions
    0..S-1; x (S, B, n, HN)."""
    dim = int(HN * rotary_percent)
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = torch.arange(S, dtype=torch.float64)[:, None] * inv[None]  # (S, dim / 2)
    cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
    x1, x2, rest = x[..., : dim // 2], x[..., dim // 2 : dim], x[..., dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def _rms64(x, w, eps, one_plus=False):
    x = x.double()
    gain = w.double() + 1.0 if one_plus else w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def _cases() -> dict:
    from workers.common import build, make_config

    from megatron_gamma.model.init import param_init

    out = {}
    tokens = torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(0))
    # Grouped-query attention: Megatron-LM's --group-query-attention without --num-query-groups
    # means one group; with it, that many.
    for name, extra in (
        ("gqa-default", dict(group_query_attention=True)),
        ("gqa-2", dict(group_query_attention=True, num_query_groups=2)),
        ("mha", {}),
    ):
        model = build(make_config(dict(BASE, **extra), {}))[0][0]
        seen = _capture(model, tokens)
        attention = model.decoder.layers[0].self_attention
        out[name] = {
            "groups": model.config.num_query_groups,
            "qkv_shape": list(attention.linear_qkv.weight.shape),
            "key_shape": list(seen["key"].shape),
            "query_shape": list(seen["query"].shape),
        }
    # Partial RoPE: the query/key reaching core attention are the fp64 rotation of linear_qkv's.
    for percent in (0.5, 1.0):
        model = build(make_config(dict(BASE, rotary_percent=percent), {}))[0][0]
        seen = _capture(model, tokens)
        q, k, _ = _split_qkv(seen["qkv"], 4, 4)
        out[f"rope-{percent}"] = {
            "q_err": float((seen["query"] - _rope64(q, percent)).abs().max()),
            "k_err": float((seen["key"] - _rope64(k, percent)).abs().max()),
            "q_scale": float(q.abs().max()),
            "passed_through": bool(
                torch.equal(seen["query"][..., int(HN * percent) :], q[..., int(HN * percent) :])
            ),
            "rotated_differs": float((seen["query"] - q).abs().max()),
        }
    # qk_layernorm: our RMSNorm (eps = norm_epsilon) on each head's q and k.
    cfg = make_config(dict(BASE, qk_layernorm=True, position_embedding_type="learned_absolute"), {})
    model = build(cfg)[0][0]
    attention = model.decoder.layers[0].self_attention
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for norm in (attention.q_layernorm, attention.k_layernorm):
            norm.weight.add_(0.5 * torch.randn(norm.weight.shape, generator=gen))
    seen = _capture(model, tokens)
    q, k, _ = _split_qkv(seen["qkv"], 4, 4)
    eps = 1e-12
    out["qk"] = {
        "classes": [type(n).__qualname__ for n in (attention.q_layernorm, attention.k_layernorm)],
        "eps": [attention.q_layernorm.eps, attention.k_layernorm.eps],
        "weight_shape": list(attention.q_layernorm.weight.shape),
        "q_err": float((seen["query"] - _rms64(q, attention.q_layernorm.weight, eps)).abs().max()),
        "k_err": float((seen["key"] - _rms64(k, attention.k_layernorm.weight, eps)).abs().max()),
        "roles": sorted(
            {param_init(n, cfg, 256).role for n, _ in model.named_parameters() if "q_layern" in n}
        ),
    }
    # --apply-layernorm-1p: every norm weight starts at 0 (gain 1); y = x_hat * (1 + w).
    model = build(make_config(dict(BASE, apply_layernorm_1p=True, qk_layernorm=True), {}))[0][0]
    norms = {n: p for n, p in model.named_parameters() if n.endswith("layernorm.weight")}
    out["1p"] = {"norms": len(norms), "all_zero": all(bool((p == 0).all()) for p in norms.values())}
    norm = model.decoder.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(norm.weight.shape, generator=gen))
        x = 1e-7 * torch.randn(S, B, 64, generator=gen)  # sigma^2 ~ 1e-14 << 1e-5
        y = norm(x).double()
    ref = _rms64(x, norm.weight, eps, one_plus=True)
    out["1p"]["rel_err"] = float((y - ref).abs().max() / ref.abs().max())
    return out


@pytest.fixture(scope="module")
def cases():
    return run_distributed(_cases, 1)[0]


@pytest.mark.timeout(300)
def test_group_query_attention_kv_shapes(cases):
    for name, groups in (("gqa-default", 1), ("gqa-2", 2), ("mha", 4)):
        c = cases[name]
        assert c["groups"] == groups
        assert c["qkv_shape"] == [(4 + 2 * groups) * HN, 64]  # q heads + k and v per group
        assert c["key_shape"] == [S, B, groups, HN]
        assert c["query_shape"] == [S, B, 4, HN]


def test_group_query_attention_semantics():
    assert load_config(None, {"group_query_attention": True}).model.num_query_groups == 1
    cfg = load_config(None, {"num_query_groups": 2})  # honored without the switch
    assert cfg.model.num_query_groups == 2
    with pytest.raises(ConfigError, match="group_query_attention=False: contradicts"):
        load_config(None, {"group_query_attention": False, "num_query_groups": 2})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("percent", [0.5, 1.0])
def test_rotary_percent_rotates_the_first_channels_only(cases, percent):
    c = cases[f"rope-{percent}"]
    assert c["q_err"] <= 1e-5 * c["q_scale"] and c["k_err"] <= 1e-5 * c["q_scale"]
    assert c["rotated_differs"] > 1e-3 * c["q_scale"]  # the rotation did something
    if percent < 1.0:
        assert c["passed_through"]


def test_rotary_percent_validation():
    with pytest.raises(ConfigError, match="rotary_percent=0.3: rotates int"):
        load_config(None, {"rotary_percent": 0.3})  # 32 x 0.3 = 9 channels
    with pytest.raises(ConfigError, match=r"rotary_percent=1.5: must lie in \(0, 1\]"):
        load_config(None, {"rotary_percent": 1.5})


@pytest.mark.timeout(300)
def test_qk_layernorm_is_our_rmsnorm_per_head(cases):
    c = cases["qk"]
    assert c["classes"] == ["RMSNorm", "RMSNorm"] and c["eps"] == [1e-12, 1e-12]
    assert c["weight_shape"] == [HN] and c["roles"] == ["norm"]
    assert c["q_err"] < 1e-5 and c["k_err"] < 1e-5


@pytest.mark.timeout(300)
def test_apply_layernorm_1p_zero_init_and_fp64(cases):
    c = cases["1p"]
    # input, pre-MLP, q and k norms of 2 layers, and the final norm
    assert c["norms"] == 2 * 4 + 1 and c["all_zero"]
    assert c["rel_err"] < 1e-6


def test_alias_contradictions_and_local_spec_refusals():
    load_config(None, {"use_rotary_position_embeddings": True, "disable_bias_linear": True})
    with pytest.raises(ConfigError, match="use_rotary_position_embeddings=True: contradicts"):
        load_config(
            None,
            {"use_rotary_position_embeddings": True, "position_embedding_type": "learned_absolute"},
        )
    with pytest.raises(ConfigError, match="disable_bias_linear=True: contradicts"):
        load_config(None, {"disable_bias_linear": True, "add_bias_linear": True})
    with pytest.raises(ConfigError, match="attention_backend='flash'.*transformer_engine"):
        load_config(None, {"attention_backend": "flash"})
    with pytest.raises(ConfigError, match="fp8_format='hybrid'.*transformer_engine"):
        load_config(None, {"fp8_format": "hybrid"})
    with pytest.raises(ConfigError, match="apply_layernorm_1p=True: megatron-core's stock"):
        load_config(
            None, {"apply_layernorm_1p": True, "layer_spec": "local", "gated_attention": "none"}
        )


MOE = {"num_experts": 4, "num_layers": 4}


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"qk_layernorm": True}, "qk_layernorm=True"),
        ({"add_qkv_bias": True}, "add_qkv_bias=True"),
        ({"apply_layernorm_1p": True}, "apply_layernorm_1p=True"),
        ({"rotary_percent": 0.5}, "rotary_percent=0.5"),
        ({"transformer_impl": "transformer_engine"}, "transformer_impl='transformer_engine'"),
        # trial 14: GammaMoE is every layer MoE, softmax over the top-k, no shared experts,
        # dropless; a mixed model crashed the export, the others exported other models
        ({**MOE, "moe_layer_freq": "2"}, "moe_layer_freq='2'"),
        (
            {**MOE, "moe_shared_expert_intermediate_size": 32},
            "moe_shared_expert_intermediate_size=32",
        ),
        ({**MOE, "moe_router_score_function": "sigmoid"}, "moe_router_score_function='sigmoid'"),
        ({**MOE, "moe_expert_capacity_factor": 0.5}, "moe_expert_capacity_factor=0.5"),
    ],
)
def test_hf_export_refuses_what_its_mapping_does_not_express(flags, named):
    from megatron_gamma.hf.mapping import UnmappableArchitectureError, check_mappable

    assert check_mappable(load_config(None, {}), "auto") == "gamma_gpt"
    assert check_mappable(load_config(None, MOE), "auto") == "gamma_gpt"
    with pytest.raises(UnmappableArchitectureError, match=named):
        check_mappable(load_config(None, flags), "auto")

"""The Transformer Engine backend (``--transformer-impl transformer_engine``).

Without Transformer Engine (this CPU machine): the flag is refused by name, and the weight-role
registry covers every parameter name the TE spec creates. That coverage test is derived from
megatron-core's real code where it can be: its ``TESpecProvider`` (imported with placeholder
classes standing in for the TE wrappers, which cannot be imported without TE), its
``get_gpt_layer_with_transformer_engine_spec`` and our ``te_layer_spec`` give the module tree;
what is *listed* here is the parameters each TE wrapper class registers (:data:`TE_PARAMS`, from
Transformer Engine's ``LayerNormLinear`` / ``Linear`` / ``RMSNorm`` modules with RMSNorm
normalization) and the submodule names two megatron-core modules add outside their spec
(``SequentialMLP``'s ``local_experts.E``; ``GatedSelfAttention``'s ``linear_gate``).

With Transformer Engine and a GPU: construction tests build the TE model (both gate
granularities) and check roles, the gamma-init, eps and TE's RMSNorm against fp64.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types

import pytest
import torch
from helpers import TINY

from megatron_gamma.config import ConfigError, load_config

TE_CLASSES = """TEActivationOp TEColumnParallelGroupedLinear TEColumnParallelLinear
TEDotProductAttention TELayerNormColumnParallelLinear TELinear TENorm TERowParallelGroupedLinear
TERowParallelLinear""".split()

TE_PARAMS = {
    "TELayerNormColumnParallelLinear": ("weight", "layer_norm_weight"),
    "TEColumnParallelLinear": ("weight",),
    "TERowParallelLinear": ("weight",),
    "TELinear": ("weight",),
    "TENorm": ("weight",),
    "TEDotProductAttention": (),
    "TEActivationOp": (),
    "TopKRouter": ("weight",),
}
"""Parameters of each module class with RMSNorm and no bias (listed from Transformer Engine's
modules; linears add ``bias`` with a bias)."""

SMALL = TINY

try:
    from megatron.core.models.gpt.gpt_layer_specs import HAVE_TE
except ImportError:
    HAVE_TE = False
needs_te = pytest.mark.skipif(
    not (HAVE_TE and torch.cuda.is_available()),
    reason="needs Transformer Engine and a CUDA GPU (not importable here)",
)


def _te_config(**model):
    return load_config(None, dict(SMALL, transformer_impl="transformer_engine", **model))


@pytest.fixture
def placeholder_te(monkeypatch):
    """megatron-core's real TESpecProvider and TE spec function, with placeholder classes (named
    like megatron-core's TE wrappers) standing in for its ``extensions.transformer_engine``."""
    from megatron.core.models.gpt import gpt_layer_specs

    from megatron_gamma.model import te_backend

    fake = types.ModuleType("megatron.core.extensions.transformer_engine")
    for name in TE_CLASSES:
        setattr(fake, name, type(name, (), {}))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    provider_module = "megatron.core.extensions.transformer_engine_spec_provider"
    monkeypatch.delitem(sys.modules, provider_module, raising=False)
    import megatron.core.extensions.transformer_engine_spec_provider as provider

    monkeypatch.setattr(provider, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(gpt_layer_specs, "TESpecProvider", provider.TESpecProvider, raising=False)
    monkeypatch.setattr(
        te_backend,
        "te_modules",
        lambda: types.SimpleNamespace(
            norm=fake.TENorm, layernorm_linear=fake.TELayerNormColumnParallelLinear
        ),
    )
    sys.modules.pop(provider_module)  # the placeholder-backed provider stays in this test
    return fake


def _walk(spec, prefix: str):
    """(parameter path, module class name) of every leaf module a layer spec builds."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    from megatron_gamma.model.gated_attention import GatedSelfAttention

    if isinstance(spec, type):
        return [] if issubclass(spec, IdentityOp) else [(prefix, spec.__name__)]
    out = []
    if spec.module is GatedSelfAttention:
        out.append((prefix + "linear_gate", spec.params["gate_linear"].__name__))
    if spec.module is SequentialMLP:
        prefix += "local_experts.0."
    if spec.submodules is None:
        return out
    for f in dataclasses.fields(spec.submodules):
        value = getattr(spec.submodules, f.name)
        if f.name == "shared_experts":  # built only with a shared-expert size (not set)
            continue
        if isinstance(value, ModuleSpec):
            out += _walk(value, f"{prefix}{f.name}.")
        elif isinstance(value, type):
            out += _walk(value, f"{prefix}{f.name}")
    return out


def _te_parameter_names(cfg):
    from megatron_gamma.model.builder import layer_spec

    spec, final_norm = layer_spec(cfg)
    m = cfg.model
    names = ["embedding.word_embeddings.weight", "output_layer.weight"]
    names += [f"decoder.final_layernorm.{p}" for p in TE_PARAMS[final_norm.__name__]]
    for path, cls in _walk(spec, "decoder.layers.0."):
        names += [f"{path}.{p}" for p in TE_PARAMS[cls]]
        linear = "Linear" in cls and cls != "TopKRouter"
        if linear and (m.gate_bias if path.endswith("linear_gate") else m.add_bias_linear):
            names.append(f"{path}.bias")
    return names


VARIANTS = {
    "elementwise-qk": dict(qk_layernorm=True),
    "headwise-bias": dict(gated_attention="headwise", gate_bias=True, add_bias_linear=True),
    "moe-1p": dict(num_experts=4, apply_layernorm_1p=True),
    "stock-te-spec": dict(layer_spec="local", gated_attention="none"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_registry_covers_te_parameter_names(placeholder_te, variant):
    from megatron_gamma.model.init import param_init
    from megatron_gamma.model.roles import REGISTRY, norm_kind

    cfg = _te_config(**VARIANTS[variant])
    names = _te_parameter_names(cfg)
    roles = {}
    for name in names:
        matches = [r.name for r in REGISTRY if re.search(r.pattern, name)]
        assert len(matches) == 1, (name, matches)
        roles[name] = param_init(name, cfg, 256)
    layer = "decoder.layers.0."
    fused = [layer + "self_attention.linear_qkv.layer_norm_weight"]
    fused += [] if cfg.model.num_experts else [layer + "mlp.linear_fc1.layer_norm_weight"]
    expected_norm = 0.0 if cfg.model.apply_layernorm_1p else 1.0
    for name in fused + ["decoder.final_layernorm.weight"]:
        assert roles[name].role == "norm" and roles[name].constant == expected_norm, name
    assert roles[layer + "self_attention.linear_qkv.weight"].role == "qkv"
    assert roles[layer + "self_attention.linear_proj.weight"].role == "attn_out"
    gated = cfg.model.gated_attention != "none"
    assert (layer + "self_attention.linear_gate.weight" in roles) == gated
    if gated:
        assert roles[layer + "self_attention.linear_gate.weight"].role == "gate"
        assert roles[layer + "self_attention.linear_gate.layer_norm_weight"].role == "norm"
    if cfg.model.qk_layernorm:
        assert roles[layer + "self_attention.q_layernorm.weight"].role == "norm"
        assert roles[layer + "self_attention.k_layernorm.weight"].role == "norm"
    if cfg.model.num_experts:
        assert roles[layer + "mlp.router.weight"].role == "router"
        assert roles[layer + "mlp.experts.local_experts.0.linear_fc1.weight"].role == "expert_fc1"
        assert roles[layer + "pre_mlp_layernorm.weight"].role == "norm"
    else:
        assert roles[layer + "mlp.linear_fc2.weight"].role == "fc2"
    kinds = {norm_kind(n) for n in names if n.startswith(layer) and roles[n].role == "norm"}
    qk = {"q_layernorm", "k_layernorm"} if cfg.model.qk_layernorm else set()
    assert kinds == {"input_layernorm", "pre_mlp_layernorm"} | qk  # the probes find them all
    assert norm_kind("decoder.final_layernorm.weight") == "final_layernorm"
    biases = [n for n in names if n.endswith(".bias")]
    assert bool(biases) == (variant == "headwise-bias")
    assert all(roles[n].role == "bias" for n in biases)


@pytest.mark.skipif(HAVE_TE, reason="Transformer Engine is importable here")
def test_transformer_engine_is_refused_by_name_without_it():
    from megatron_gamma.model.builder import layer_spec
    from megatron_gamma.model.te_backend import check_backend

    cfg = _te_config()
    refusal = r"transformer_impl='transformer_engine': transformer_engine cannot be imported"
    with pytest.raises(ConfigError, match=refusal + r".*Fix: install Transformer Engine"):
        check_backend(cfg)
    with pytest.raises(ConfigError, match=refusal):
        layer_spec(cfg)
    check_backend(load_config(None, SMALL))  # the local backend needs nothing


def test_fp8_is_refused_by_name_without_an_fp8_gpu(monkeypatch):
    from megatron_gamma.model import te_backend

    monkeypatch.setattr(te_backend, "te_import_error", lambda: "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = _te_config(fp8_format="hybrid")
    with pytest.raises(ConfigError, match=r"fp8_format='hybrid': FP8 .* no CUDA GPU"):
        te_backend.check_backend(cfg)
    te_backend.check_backend(cfg, need_gpu=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    te_backend.check_backend(cfg)  # Hopper: FP8 ok
    mx = _te_config(fp8_format="e4m3", fp8_recipe="mxfp8")
    with pytest.raises(ConfigError, match=r">= 10.0; this machine has compute capability 9.0"):
        te_backend.check_backend(mx)


def _build_te(model: dict):
    from megatron_gamma import parallel
    from megatron_gamma.model.builder import build_model, transformer_config
    from megatron_gamma.model.roles import role_of

    cfg = load_config(None, dict(SMALL, transformer_impl="transformer_engine", **model))
    parallel.initialize(cfg)
    tcfg = transformer_config(cfg, on_gpu=True)
    models, plan = build_model(cfg, tcfg, 256)
    model = models[0]
    params = dict(model.named_parameters())
    out = {
        "roles": {n: role_of(n).name for n in params},
        "planned": sorted(n for n in plan) == sorted(params),
        "norms_one": all(bool((p == 1).all()) for n, p in params.items() if "norm" in n),
        "eps": model.decoder.layers[0].self_attention.linear_qkv.eps,
    }
    tokens = torch.randint(0, 256, (2, 16), device="cuda")
    logits = model(tokens, torch.arange(16, device="cuda").expand(2, -1), None)
    out["finite"] = bool(torch.isfinite(logits).all())
    norm = model.decoder.final_layernorm
    x = 1e-7 * torch.randn(16, 2, 64, device="cuda")
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, device="cuda") + 0.5)
        y = norm(x).double()
    x64, w64 = x.double(), norm.weight.double()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-12) * w64
    out["rms_rel_err"] = float((y - ref).abs().max() / ref.abs().max())
    parallel.destroy()
    return out


@needs_te
@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
def test_te_model_builds_with_gamma_init_and_gates(granularity):
    from distributed import run_distributed

    (r,) = run_distributed(_build_te, 1, dict(gated_attention=granularity))
    assert r["planned"] and r["norms_one"] and r["finite"]
    assert r["eps"] == 1e-12
    assert r["roles"]["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"] == "norm"
    assert r["roles"]["decoder.layers.0.self_attention.linear_gate.weight"] == "gate"
    assert r["rms_rel_err"] < 1e-5  # TE normalizes in fp32: sigma^2 ~ 1e-14 still resolved

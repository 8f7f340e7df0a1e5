"""The weight-role registry: every parameter has one role, and every consumer uses its name.

Models are real megatron-core GPTModels built by ``model.builder`` in a spawned process
(:func:`distributed.run_distributed`). References: megatron-core's own tensor-parallel
attributes (``tensor_model_parallel``, ``partition_dim``) for the registry's partition
dimension, and an fp64 SVD for the stable rank of the router and of single experts.
"""

from __future__ import annotations

import re

import pytest
from distributed import run_distributed
from helpers import TINY

DENSE = TINY
VARIANTS = {
    "dense": dict(DENSE, gated_attention="none", swiglu=False, add_bias_linear=True),
    "gated-elementwise": dict(DENSE, gated_attention="elementwise"),
    "gated-headwise": dict(DENSE, gated_attention="headwise", gate_bias=True),
    "gqa": dict(DENSE, num_query_groups=2, position_embedding_type="learned_absolute"),
    "tied": dict(DENSE, untie_embeddings_and_output_weights=False),
    "moe": dict(DENSE, num_experts=4, moe_ffn_hidden_size=32),
    "qk-norm-1p": dict(DENSE, qk_layernorm=True, apply_layernorm_1p=True),
    # --moe-layer-freq: a dense layer 0 and an MoE layer 1 with shared experts.
    "moe-shared-mixed": dict(
        DENSE,
        num_experts=4,
        moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=48,
        moe_layer_freq="[0,1]",
    ),
}


def _report(variant: str, tp: int) -> dict:
    """Build ``variant`` under TP=``tp``; report what every consumer calls each weight."""
    import torch
    from megatron.core import parallel_state

    from megatron_gamma import parallel
    from megatron_gamma.config import config_from_dict
    from megatron_gamma.diagnostics.probes import (
        aggregate_experts,
        weight_diagnostics,
        weight_matrices,
    )
    from megatron_gamma.model.builder import build_model, transformer_config
    from megatron_gamma.model.roles import REGISTRY, role_of
    from megatron_gamma.model.vocab import padded_vocab_size
    from megatron_gamma.training.init_audit import audit_init

    par = {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1}
    cfg = config_from_dict({"model": VARIANTS[variant], "parallel": par})
    parallel.initialize(cfg)
    vocab = padded_vocab_size(256, cfg)
    models, plan = build_model(cfg, transformer_config(cfg, on_gpu=False), vocab)
    model = models[0]
    params = {}
    for name, param in model.named_parameters():
        params[name] = {
            "matches": [r.name for r in REGISTRY if re.search(r.pattern, name)],
            "role": role_of(name).name,
            "mcore_tp": bool(getattr(param, "tensor_model_parallel", False)),
            "mcore_dim": getattr(param, "partition_dim", None),
            "registry_dim": role_of(name).partition_dim,
            "group": role_of(name).group.value,
        }
    audit = audit_init(models, cfg, vocab)
    tp_group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    diag = aggregate_experts(weight_diagnostics(models, tp_group, max_rows=None))
    out = {
        "params": params,
        "plan_roles": sorted({p.role for p in plan.values()}),
        "audit_roles": sorted({r["role"] for r in audit}),
        "diag_roles": sorted({m.role for m in weight_matrices(model, tp)}),
        "diag": diag,
        "tied": bool(model.share_embeddings_and_output_weights),
    }
    if variant == "moe":
        layer = model.decoder.layers[1].mlp
        ref = {}
        for key, w in (
            ("router/layer_01", layer.router.weight),
            ("expert_fc2/layer_01/expert_02", layer.experts.local_experts[2].linear_fc2.weight),
            ("expert_fc1.up/layer_01/expert_03", layer.experts.local_experts[3].linear_fc1.weight),
        ):
            w = w.detach().double()
            if key.startswith("expert_fc1.up"):
                w = w.chunk(2, dim=0)[1]
            s = torch.linalg.svdvals(w)
            ref[key] = float((s**2).sum() / s[0] ** 2)
        out["reference_stable_rank"] = ref
    parallel.destroy()
    return out


def _reports() -> dict:
    return {v: _report(v, 1) for v in VARIANTS}


@pytest.fixture(scope="module")
def reports():
    return run_distributed(_reports, 1)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_parameter_has_exactly_one_role(reports, variant):
    params = reports[variant]["params"]
    for name, p in params.items():
        assert p["matches"] == [p["role"]], (name, p["matches"])
    roles = {p["role"] for p in params.values()}
    assert {"embedding", "qkv", "attn_out", "norm"} <= roles
    assert ("gate" in roles) == (variant != "dense")
    assert ("bias" in roles) == (variant in ("dense", "gated-headwise"))
    assert ("pos_embedding" in roles) == (variant == "gqa")
    assert ("output" in roles) == (variant != "tied")
    moe = {"router", "expert_fc1", "expert_fc2"}
    assert (moe <= roles) == variant.startswith("moe") and (("fc1" in roles) == (variant != "moe"))
    assert ({"shared_fc1", "shared_fc2"} <= roles) == (variant == "moe-shared-mixed")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_init_audit_and_diagnostics_report_the_same_names(reports, variant):
    r = reports[variant]
    matrices = sorted({p["role"] for p in r["params"].values()} - {"bias", "norm"})
    assert r["plan_roles"] == sorted({p["role"] for p in r["params"].values()})
    assert r["audit_roles"] == r["plan_roles"]
    assert sorted({d.split(".")[0] for d in r["diag_roles"]}) == matrices
    for key in r["diag"]:  # every tag names a registry role (or role.part)
        role = key.split("/")[1].split(".")[0]
        assert role in matrices, key


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["moe", "moe-shared-mixed"])
def test_registry_partition_dim_is_megatron_cores(variant):
    """Under TP=2 the registry's split dimension is the one megatron-core tags each weight with."""
    (report, _) = run_distributed(_report, 2, variant, 2)
    checked = 0
    for name, p in report["params"].items():
        if p["mcore_tp"]:
            assert p["registry_dim"] == p["mcore_dim"], name
            checked += 1
        elif p["role"] not in ("expert_fc1", "expert_fc2"):  # experts: expert TP size 1
            assert p["registry_dim"] is None, name
    assert checked >= 10


@pytest.mark.timeout(300)
def test_moe_experts_and_router_get_every_weight_diagnostic(reports):
    diag = reports["moe"]["diag"]
    for layer in (0, 1):
        for metric in ("stable_rank", "top_share", "condensation"):
            assert f"{metric}/router/layer_{layer:02d}" in diag
            for role in ("expert_fc1.gate", "expert_fc1.up", "expert_fc2"):
                per_expert = [
                    diag[f"{metric}/{role}/layer_{layer:02d}/expert_{e:02d}"] for e in range(4)
                ]
                mean = diag[f"{metric}/{role}/layer_{layer:02d}"]
                assert mean == pytest.approx(sum(per_expert) / 4, rel=1e-12)
    for key, ref in reports["moe"]["reference_stable_rank"].items():
        assert diag[f"stable_rank/{key}"] == pytest.approx(ref, rel=1e-9), key
    assert 0.0 <= diag["condensation/router/layer_00"] <= 1.0

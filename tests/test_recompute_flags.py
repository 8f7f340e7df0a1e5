"""Megatron-LM's ``--recompute-activations`` / ``--recompute-modules``: validated, passed to
megatron-core, and selective recompute gives the loss and gradients of the run without it.

Reference: the same model (same gamma-init, counter-based, bit for bit) without recompute, in
fp32 on one process.
"""

from __future__ import annotations

import importlib.util

import pytest
from distributed import run_distributed

from megatron_gamma.config import RECOMPUTE_MODULES, ConfigError, load_config

# Mixed dense/MoE layers with shared experts, so that every supported module is recomputed.
MODEL = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    seq_length=16,
    vocab_size=256,
    num_experts=4,
    moe_ffn_hidden_size=32,
    moe_shared_expert_intermediate_size=32,
    moe_layer_freq="[0,1]",
)


def test_recompute_flags_follow_megatron_lm():
    cfg = load_config(None, {"recompute_activations": True})
    assert cfg.training.recompute_granularity == "selective"
    cfg = load_config(None, {"recompute_activations": True, "recompute_modules": ["mlp", "moe"]})
    assert cfg.training.recompute_modules == ["mlp", "moe"]
    with pytest.raises(ConfigError, match="recompute_activations=True: .*'full'"):
        load_config(None, {"recompute_activations": True, "recompute_granularity": "full"})
    with pytest.raises(ConfigError, match="recompute_modules=.*only with selective"):
        load_config(None, {"recompute_modules": ["mlp"]})
    with pytest.raises(ConfigError, match="recompute_modules='moe_act': .*grouped-gemm"):
        load_config(None, {"recompute_activations": True, "recompute_modules": ["moe_act"]})
    if not HAVE_TE:
        with pytest.raises(ConfigError, match="recompute_modules='layernorm': .*Transformer"):
            load_config(None, {"recompute_activations": True, "recompute_modules": "layernorm"})


def _loss_and_grads(modules: list[str] | None) -> tuple[float, dict, list]:
    """One forward and backward of the model (selective recompute of ``modules``, or none)."""
    import torch
    from workers.common import build, make_config

    cfg = make_config(MODEL, {})
    if modules is not None:
        cfg = cfg.replace(recompute_granularity="selective", recompute_modules=modules)
    models, vocab = build(cfg)
    model = models[0]
    model.train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (2, 16), generator=gen)
    labels = torch.randint(0, vocab, (2, 16), generator=gen)
    position_ids = torch.arange(16).expand(2, 16)
    loss = model(tokens, position_ids, None, labels=labels).mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return float(loss), grads, list(model.config.recompute_modules or [])


HAVE_TE = importlib.util.find_spec("transformer_engine") is not None
SUPPORTED = [m for m in RECOMPUTE_MODULES if HAVE_TE or m != "layernorm"]


def _compare() -> dict:
    ref_loss, ref_grads, _ = _loss_and_grads(None)
    loss, grads, used = _loss_and_grads(SUPPORTED)
    diff = max(float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads)
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    return {"loss": (loss, ref_loss), "diff": diff, "scale": scale, "used": used}


@pytest.mark.timeout(300)
def test_selective_recompute_gives_the_loss_and_grads_of_no_recompute():
    out = run_distributed(_compare, 1)[0]
    assert out["used"] == SUPPORTED
    loss, ref = out["loss"]
    assert loss == pytest.approx(ref, abs=1e-6)
    assert out["diff"] <= 1e-6 * max(1.0, out["scale"])

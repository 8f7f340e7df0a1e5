"""Gated attention (paper, Architectural Interventions 2): Y' = Y * sigmoid(X W_g)."""

import dataclasses
import math

import pytest
import torch
from distributed import run_distributed
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from workers.common import build, gather_global, make_config

from megatron_gamma.model.builder import layer_spec, transformer_config

H, HEADS, HEAD_DIM, FFN, LAYERS, SEQ, EPS = 64, 4, 16, 128, 2, 16, 1e-12


BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, seq_length=16)
TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
POSITIONS = torch.arange(16).expand(2, -1)


def _count(models):
    return sum(p.numel() for m in models for p in m.parameters())


def _logits(model):
    return model(TOKENS, POSITIONS, None)


def _megatron_model(cfg, spec, **overrides):
    tcfg = dataclasses.replace(transformer_config(cfg, on_gpu=False), **overrides)
    return GPTModel(
        config=tcfg,
        transformer_layer_spec=spec,
        vocab_size=256,
        max_sequence_length=16,
        position_embedding_type="rope",
    )


def _single_cases():
    """One process: parameter counts per granularity; the ungated model against megatron-core's
    own local spec; our elementwise gate against megatron-core's fused ``attention_output_gate``
    with copied weights; a 2-layer model's logits and gradients for the hand-written reference."""
    out = {"counts": {}}
    for gate in ("none", "elementwise", "headwise"):
        for bias in (False, True):
            models, _ = build(make_config(dict(BASE, gated_attention=gate, gate_bias=bias), {}))
            out["counts"][f"{gate}-{bias}"] = _count(models)
    # Ungated model vs megatron-core's stock local spec (its own norm and DotProductAttention).
    cfg = make_config(dict(BASE, gated_attention="none"), {})
    ours = build(cfg)[0][0]
    stock = _megatron_model(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"))
    out["stock_names"] = sorted((n, list(p.shape)) for n, p in stock.named_parameters())
    out["our_names"] = sorted((n, list(p.shape)) for n, p in ours.named_parameters())
    stock.load_state_dict(ours.state_dict(), strict=False)
    with torch.no_grad():
        out["stock_max_diff"] = float((_logits(ours) - _logits(stock)).abs().max())
    # --layer-spec local builds megatron-core's stock spec itself, gamma-initialized like ours.
    local = build(make_config(dict(BASE, gated_attention="none", layer_spec="local"), {}))[0][0]
    norm = type(local.decoder.layers[0].input_layernorm)
    out["local_norm"] = f"{norm.__module__}.{norm.__qualname__}"
    mine, theirs = dict(ours.named_parameters()), dict(local.named_parameters())
    out["local_equals_ours"] = list(mine) == list(theirs) and all(
        torch.equal(mine[n], theirs[n]) for n in mine
    )
    with torch.no_grad():
        out["local_equals_stock"] = bool(torch.equal(_logits(local), _logits(stock)))
    # Our elementwise gate vs megatron-core's fused attention_output_gate.
    cfg = make_config(dict(BASE, gated_attention="elementwise"), {})
    ours = build(cfg)[0][0]
    plain_cfg = make_config(dict(BASE, gated_attention="none"), {})
    fused = _megatron_model(plain_cfg, layer_spec(plain_cfg)[0], attention_output_gate=True)
    state = ours.state_dict()
    head, groups = 16, 4
    for i in range(BASE["num_layers"]):
        pre = f"decoder.layers.{i}.self_attention."
        qkv = state.pop(pre + "linear_qkv.weight").view(groups, 3, head, 64)
        gate = state.pop(pre + "linear_gate.weight").view(groups, 1, head, 64)
        # megatron-core's fused layout per query group: [q, gate, k, v]
        fused_rows = torch.cat([qkv[:, :1], gate, qkv[:, 1:]], dim=1).reshape(-1, 64)
        state[pre + "linear_qkv.weight"] = fused_rows
    fused.load_state_dict(state, strict=False)
    with torch.no_grad():
        out["fused_max_diff"] = float((_logits(ours) - _logits(fused)).abs().max())
    # A 2-layer model for the hand-written reference: weights, logits, gradients.
    for gate in ("elementwise", "headwise"):
        model = build(make_config(dict(BASE, gated_attention=gate), {}))[0][0]
        with torch.no_grad():  # non-trivial gates and norm weights
            for name, p in model.named_parameters():
                if "layernorm" in name:
                    p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
                if "linear_gate" in name:
                    p.mul_(50.0)
        logits = _logits(model)
        logits.float().pow(2).mean().backward()
        out[gate] = {
            "weights": {n: p.detach().tolist() for n, p in model.named_parameters()},
            "grads": {n: p.grad.tolist() for n, p in model.named_parameters()},
            "logits": logits.detach().tolist(),
            "tokens": TOKENS.tolist(),
        }
    return out


def _tp_cases():
    """Two processes: loss and global gradients at TP=1 (DP=2) and TP=2, both granularities,
    with and without GQA."""
    out = {}
    for gate in ("elementwise", "headwise"):
        for groups in (4, 2):
            model = dict(BASE, gated_attention=gate, num_query_groups=groups)
            result = {}
            for tp_size in (1, 2):
                models, _ = build(make_config(model, {"tensor_model_parallel_size": tp_size}))
                labels = torch.roll(TOKENS, -1, dims=1)
                loss = models[0](TOKENS, POSITIONS, None, labels=labels).float().mean()
                loss.backward()
                grads = gather_global(models, use_grads=True)
                result[tp_size] = (float(loss), grads)
            if torch.distributed.get_rank() == 0:
                (l1, g1), (l2, g2) = result[1], result[2]
                out[f"{gate}-groups{groups}"] = {
                    "loss": [l1, l2],
                    "max_rel_grad_diff": max(
                        float((g1[k] - g2[k]).abs().max() / g1[k].abs().max().clamp_min(1e-30))
                        for k in g1
                    ),
                    "keys_equal": sorted(g1) == sorted(g2),
                }
    return out


@pytest.fixture(scope="module")
def single():
    return run_distributed(_single_cases, 1)[0]


def test_parameter_counts(single):
    c = single["counts"]
    assert c["none-True"] == c["none-False"]
    assert c["elementwise-False"] - c["none-False"] == LAYERS * H * HEADS * HEAD_DIM
    assert c["elementwise-True"] - c["elementwise-False"] == LAYERS * HEADS * HEAD_DIM
    assert c["headwise-False"] - c["none-False"] == LAYERS * H * HEADS
    assert c["headwise-True"] - c["headwise-False"] == LAYERS * HEADS


def test_ungated_model_is_megatron_cores_and_elementwise_matches_fused_gate(single):
    assert single["our_names"] == single["stock_names"]
    assert single["stock_max_diff"] < 1e-5  # megatron's torch RMSNorm and DotProductAttention
    assert single["fused_max_diff"] < 1e-6  # megatron-core's attention_output_gate


def test_layer_spec_local_is_megatron_cores_stock_spec_with_our_init(single):
    assert not single["local_norm"].startswith("megatron_gamma"), single["local_norm"]
    assert single["local_equals_ours"]  # same names, same gamma-init values
    assert single["local_equals_stock"]  # same logits as the stock spec given our weights


def test_layer_spec_local_refuses_a_gate():
    from megatron_gamma.config import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match="layer_spec='local'.*Fix: add --gated-attention none"):
        ModelConfig(layer_spec="local")
    with pytest.raises(ConfigError, match="layer_spec='stock': unknown"):
        ModelConfig(layer_spec="stock", gated_attention="none")


def _rms(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(t):
    """Rotate-half RoPE, base 10000, over the whole head dim; t: (s, b, n, d)."""
    inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    freqs = torch.outer(torch.arange(SEQ, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], -1)[:, None, None, :]
    half = t.shape[-1] // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], -1)
    return t * emb.cos() + rotated * emb.sin()


def reference_logits(w, tokens, granularity):
    """The gated GPT forward written out in plain torch (fp64): embedding, per layer RMSNorm ->
    QKV -> RoPE -> causal softmax attention -> sigmoid gate from the normalized input -> output
    projection -> residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; output layer."""
    x = w["embedding.word_embeddings.weight"][tokens].transpose(0, 1)  # (s, b, h)
    s, b = x.shape[:2]
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    for i in range(LAYERS):
        p = f"decoder.layers.{i}."
        xn = _rms(x, w[p + "input_layernorm.weight"])
        qkv = (xn @ w[p + "self_attention.linear_qkv.weight"].T).view(s, b, HEADS, 3 * HEAD_DIM)
        q, k, v = qkv.split(HEAD_DIM, dim=-1)
        q, k = _rope(q), _rope(k)
        scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(HEAD_DIM)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        ctx = torch.einsum("bnst,tbnd->sbnd", probs, v)
        g = torch.sigmoid(xn @ w[p + "self_attention.linear_gate.weight"].T)
        gate = g.view(s, b, HEADS, HEAD_DIM) if granularity == "elementwise" else g[..., None]
        ctx = ctx * gate
        x = x + ctx.reshape(s, b, -1) @ w[p + "self_attention.linear_proj.weight"].T
        xn = _rms(x, w[p + "pre_mlp_layernorm.weight"])
        a, u = (xn @ w[p + "mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(a) * u) @ w[p + "mlp.linear_fc2.weight"].T
    x = _rms(x, w["decoder.final_layernorm.weight"])
    return (x @ w["output_layer.weight"].T).transpose(0, 1)  # (b, s, vocab)


@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
def test_forward_and_backward_equal_hand_written_reference(single, granularity):
    case = single[granularity]
    weights = {
        n: torch.tensor(v, dtype=torch.float64, requires_grad=True)
        for n, v in case["weights"].items()
    }
    logits = reference_logits(weights, torch.tensor(case["tokens"]), granularity)
    got = torch.tensor(case["logits"], dtype=torch.float64)
    assert logits.abs().max() > 0.1  # gates and logits are far from trivial
    assert (got - logits.detach()).abs().max() <= 1e-6
    logits.pow(2).mean().backward()
    for name, param in weights.items():
        grad = torch.tensor(case["grads"][name], dtype=torch.float64)
        scale = param.grad.abs().max().clamp_min(1e-12)
        assert (grad - param.grad).abs().max() / scale <= 1e-4, name


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tensor_parallel_equals_single_rank():
    results = run_distributed(_tp_cases, 2)[0]
    assert set(results) == {f"{g}-groups{n}" for g in ("elementwise", "headwise") for n in (4, 2)}
    for name, r in results.items():
        tp1, tp2 = r["loss"]
        assert abs(tp1 - tp2) <= 1e-5 * abs(tp1), name
        assert r["keys_equal"] and r["max_rel_grad_diff"] <= 1e-5, name


def test_setup_requires_a_megatron_core_with_the_gate_hooks():
    """setup.py's megatron-core floor is a version whose attention has the output-gate hooks we
    override (0.15 has none), and the installed version satisfies it."""
    import inspect
    import re
    from importlib.metadata import version
    from pathlib import Path

    from megatron.core.transformer.attention import Attention
    from packaging.requirements import Requirement

    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text(encoding="utf-8")
    req = Requirement(re.search(r'"(megatron-core[^"]*)"', setup).group(1))
    assert "0.15.3" not in req.specifier and "0.16.0" in req.specifier
    assert version("megatron-core") in req.specifier
    params = inspect.signature(Attention.get_query_key_value_tensors).parameters
    assert "output_gate" in params and hasattr(Attention, "_apply_output_gate")

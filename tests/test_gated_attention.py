"""Gated attention (paper, Architectural Interventions 2): Y' = Y * sigmoid(X W_g)."""

import math

import pytest
import torch
from conftest import run_worker

H, HEADS, HEAD_DIM, FFN, LAYERS, SEQ, EPS = 64, 4, 16, 128, 2, 16, 1e-12


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return run_worker("gated.py", ["single"], tmp_path_factory.mktemp("gated"), nproc=1)


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


@pytest.mark.timeout(400)
def test_tensor_parallel_equals_single_rank(tmp_path):
    results = run_worker("gated.py", ["tp"], tmp_path, nproc=2)
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

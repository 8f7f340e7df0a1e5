"""Worker for tests/test_gated_attention.py.

``single``: one process. Parameter counts per granularity; the ungated model against
megatron-core's own local spec; our elementwise gate against megatron-core's fused
``attention_output_gate`` with copied weights; and a 2-layer model's logits and gradients
saved for the test's hand-written reference.
``tp``: two processes. Loss and global gradients at TP=1 (DP=2) and TP=2, both granularities,
with and without GQA.
"""

import dataclasses
import sys

import torch
from common import build, gather_global, make_config, write_result
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel

from megatron_gamma.model.builder import layer_spec, transformer_config

BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
            seq_length=16)
TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
POSITIONS = torch.arange(16).expand(2, -1)


def _count(models):
    return sum(p.numel() for m in models for p in m.parameters())


def _logits(model):
    return model(TOKENS, POSITIONS, None)


def _megatron_model(cfg, spec, **overrides):
    tcfg = dataclasses.replace(transformer_config(cfg, on_gpu=False), **overrides)
    return GPTModel(config=tcfg, transformer_layer_spec=spec, vocab_size=256,
                    max_sequence_length=16, position_embedding_type="rope")


def single():
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
    fused = _megatron_model(plain_cfg, layer_spec(plain_cfg), attention_output_gate=True)
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


def tp():
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


if __name__ == "__main__":
    write_result({"single": single, "tp": tp}[sys.argv[1]]())

"""Worker for tests/test_init.py.

``sigma``: one process; audit rows for dense and MoE models at several gammas, per-role
overrides, megatron-core's normal init, and a deliberately mis-initialized parameter.
``layouts``: two processes; global weights under TP=2, PP=2 and EP=2 vs. the single-rank layout.
"""

import sys

import torch
from common import build, gather_global, make_config, write_result

from megatron_gamma.training.init_audit import audit_init

DENSE = dict(num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4)
MOE = dict(DENSE, num_experts=4, moe_ffn_hidden_size=512)


def sigma_cases():
    out = {}
    for gamma in (0.5, 1.0, 1.5):
        for name, model in (("dense", DENSE), ("moe", MOE)):
            cfg = make_config(model, {}, {"init_gamma": gamma})
            models, vocab = build(cfg)
            out[f"{name}-{gamma}"] = audit_init(models, cfg, vocab)
    cfg = make_config(DENSE, {}, {"init_gamma_overrides": "fc2=0.75,embedding=0.5"})
    models, vocab = build(cfg)
    out["overrides"] = audit_init(models, cfg, vocab)
    cfg = make_config(DENSE, {}, {"init_method": "normal", "init_method_std": 0.02})
    models, vocab = build(cfg)
    out["normal"] = audit_init(models, cfg, vocab)
    cfg = make_config(DENSE, {})
    models, vocab = build(cfg)
    with torch.no_grad():
        models[0].decoder.layers[1].mlp.linear_fc2.weight.mul_(1.5)
    out["mis-initialized"] = audit_init(models, cfg, vocab)
    return out


def layout_cases():
    layouts = {
        "dense-tp2": (DENSE, {"tensor_model_parallel_size": 2}),
        "dense-pp2": (DENSE, {"pipeline_model_parallel_size": 2}),
        "moe-ep2": (MOE, {"expert_model_parallel_size": 2}),
        "moe-ep2-tp2-sp": (
            MOE,
            {"expert_model_parallel_size": 2, "tensor_model_parallel_size": 2,
             "sequence_parallel": True},
        ),
    }
    reference = {}
    for name, model in (("dense", DENSE), ("moe", MOE)):
        models, _ = build(make_config(model, {}))
        reference[name] = gather_global(models)
    out = {}
    for name, (model, par) in layouts.items():
        if "tp2" in name and name.startswith("moe") and torch.distributed.get_world_size() < 4:
            continue
        models, _ = build(make_config(model, par))
        got = gather_global(models)
        ref = reference[name.split("-")[0]]
        if torch.distributed.get_rank() == 0:
            out[name] = {
                "keys_equal": sorted(got) == sorted(ref),
                "max_abs_diff": max(float((got[k] - ref[k]).abs().max()) for k in ref),
                "sigma": {k: float(got[k].std()) for k in got},
                "ref_sigma": {k: float(ref[k].std()) for k in ref},
            }
    return out


def residual_cases():
    """{gamma: {width: ||update of block 1|| / ||embedding output||}} at initialization."""
    out = {}
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(64).expand(2, -1)
    for gamma in (0.5, 1.0, 1.5):
        out[gamma] = {}
        for width in (64, 128, 256, 512, 1024):
            model = dict(
                num_layers=1, hidden_size=width, num_attention_heads=width // 16,
                ffn_hidden_size=4 * width, seq_length=64,
            )
            models, _ = build(make_config(model, {}, {"init_gamma": gamma}))
            seen = {}

            def keep(key):
                def hook(module, args, output):
                    seen[key] = output[0] if isinstance(output, tuple) else output

                return hook

            net = models[0]
            net.embedding.register_forward_hook(keep("emb"))
            net.decoder.layers[0].register_forward_hook(keep("out"))
            with torch.no_grad():
                net(tokens, positions, None)
            update = seen["out"] - seen["emb"]
            out[gamma][width] = float(update.norm() / seen["emb"].norm())
    return out


if __name__ == "__main__":
    cases = {"sigma": sigma_cases, "layouts": layout_cases, "residual": residual_cases}
    write_result(cases[sys.argv[1]]())

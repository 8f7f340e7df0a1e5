"""Worker for tests/test_init.py.

``sigma``: one process; audit rows for dense and MoE models at several gammas, per-role
overrides, megatron-core's normal init, a deliberately mis-initialized parameter, and a wrong
role-table fan-in.
``layouts``: two or four processes; global weights and audit rows under TP=2, PP=2, EP=2 and the
MoE layouts (TP=2 with EP=1 with and without SP, TP2 x EP2 with expert TP 2 and 1) vs. the
single-rank layout.
"""

import sys

import torch
from common import build, gather_global, make_config, write_result

import megatron_gamma.model.init as init_module
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
    # A wrong role-table entry (fc2's fan-in doubled) that the init and the audit share.
    real = init_module.fan_in
    init_module.fan_in = lambda role, *rest: real(role, *rest) * (2 if role == "fc2" else 1)
    try:
        models, vocab = build(cfg)
        out["wrong-table"] = audit_init(models, cfg, vocab)
    finally:
        init_module.fan_in = real
    return out


def layout_cases():
    tp2 = {"tensor_model_parallel_size": 2}
    layouts = {
        "dense-tp2": (DENSE, tp2, 2),
        "dense-pp2": (DENSE, {"pipeline_model_parallel_size": 2}, 2),
        "moe-ep2": (MOE, {"expert_model_parallel_size": 2}, 2),
        "moe-tp2": (MOE, tp2, 2),
        "moe-tp2-sp": (MOE, {**tp2, "sequence_parallel": True}, 2),
        "moe-ep2-tp2-sp": (
            MOE,
            {**tp2, "expert_model_parallel_size": 2, "sequence_parallel": True},
            4,
        ),
        "moe-ep2-tp2-etp1": (
            MOE,
            {**tp2, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 1},
            4,
        ),
    }
    reference, ref_audit = {}, {}
    for name, model in (("dense", DENSE), ("moe", MOE)):
        cfg = make_config(model, {})
        models, vocab = build(cfg)
        reference[name] = gather_global(models)
        ref_audit[name] = audit_init(models, cfg, vocab)
    out = {}
    world = torch.distributed.get_world_size()
    for name, (model, par, nproc) in layouts.items():
        if world < nproc:
            continue
        cfg = make_config(model, par)
        models, vocab = build(cfg)
        got = gather_global(models)
        audit = audit_init(models, cfg, vocab)
        ref = reference[name.split("-")[0]]
        if torch.distributed.get_rank() == 0:
            out[name] = {
                "keys_equal": sorted(got) == sorted(ref),
                "max_abs_diff": max(float((got[k] - ref[k]).abs().max()) for k in ref),
                "sigma": {k: float(got[k].std()) for k in got},
                "ref_sigma": {k: float(ref[k].std()) for k in ref},
                "audit": audit,
                "ref_audit": ref_audit[name.split("-")[0]],
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
                num_layers=1,
                hidden_size=width,
                num_attention_heads=width // 16,
                ffn_hidden_size=4 * width,
                seq_length=64,
            )
            models, _ = build(make_config(model, {}, {"init_gamma": gamma}))
            seen = {}

            def keep(key, store=seen):
                def hook(module, args, output):
                    store[key] = output[0] if isinstance(output, tuple) else output

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

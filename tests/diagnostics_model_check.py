"""Single-rank checks of the diagnostics probes on a real megatron-core GPTModel.

Run as a script by tests/test_diagnostics_runs.py (it initializes torch.distributed and
megatron-core globals, so it gets its own process). Prints one JSON object of measured
discrepancies; the test asserts on them.

``model RUN_DIR``:

- the split of the fused QKV(+gate) weight: q, k, v recomputed from the split matrices and the
  captured norm output must equal what megatron-core hands to core attention (no RoPE here:
  learned absolute positions), and the gate rows must reproduce megatron-core's output gate;
- weight_diagnostics' stable ranks against an exact float64 SVD of the same matrices;
- ActivationProbe's sink share against a full float64 softmax of the captured q and k.

``reference CKPT DATA_PREFIX SEQ NUM``: independent references for a saved checkpoint: exact
float64 stable ranks of the attention-output and fc2 matrices from megatron-core's
``load_plain_tensors`` (no model built), and megatron-core's own language-model loss
(``labels=``) on the windows ``compare`` scores.

``tp RUN_DIR OUT_DIR`` (under torchrun, 2 processes): load RUN_DIR's newest checkpoint into
a TP=2 Trainer's model (loader.load_model_weights; dist_checkpointing reshards), run the live
DiagnosticsCallback once (no training step) and write its values to OUT_DIR/diagnostics.json;
then save the same weights as a TP=2 checkpoint in OUT_DIR (with the run's config.yaml), for
``analyze`` to read.
"""

from __future__ import annotations

import json
import math
import sys

import torch


def main(run_dir: str) -> None:
    from megatron_gamma import parallel
    from megatron_gamma.config import config_from_dict
    from megatron_gamma.diagnostics.probes import (
        ActivationProbe,
        weight_diagnostics,
        weight_matrices,
    )
    from megatron_gamma.model.builder import build_model_chunk, transformer_config

    cfg = config_from_dict(
        {
            "model": {
                "num_layers": 2,
                "hidden_size": 64,
                "ffn_hidden_size": 128,
                "num_attention_heads": 4,
                "num_query_groups": 2,
                "seq_length": 16,
                "position_embedding_type": "learned_absolute",
                "gated_attention": "elementwise",
            },
            "init": {"init_gamma": 0.5},
            "training": {"micro_batch_size": 2, "global_batch_size": 2},
            "logging": {"run_dir": run_dir},
        }
    )
    parallel.initialize(cfg)
    model, _ = build_model_chunk(cfg, transformer_config(cfg, on_gpu=False), 256)
    model.eval()
    seen: dict = {}
    handles = []
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attention

        def pre_core(module, args, kwargs, i=i):
            seen[("qkv", i)] = tuple(a.detach().clone() for a in args[:3])

        def pre_linear(module, args, i=i, name="qkv_in"):
            seen[(name, i)] = args[0].detach().clone()

        def post_core(module, args, output, i=i):
            seen[("core_out", i)] = output.detach().clone()

        handles.append(attn.core_attention.register_forward_pre_hook(pre_core, with_kwargs=True))
        handles.append(attn.core_attention.register_forward_hook(post_core))
        handles.append(attn.linear_qkv.register_forward_pre_hook(pre_linear))
        handles.append(
            attn.linear_proj.register_forward_pre_hook(
                lambda m, a, i=i: seen.__setitem__(("proj_in", i), a[0].detach().clone())
            )
        )
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2, 16), generator=gen)
    positions = torch.arange(16).unsqueeze(0).expand(2, -1)
    with torch.no_grad(), ActivationProbe([model]) as probe:
        model(tokens, positions, None)
    for h in handles:
        h.remove()
    acts = probe.results()
    out = {"split_err": 0.0, "gate_err": 0.0, "stable_rank_rel_err": 0.0, "sink_err": 0.0}
    mats = weight_matrices(model)
    roles = {(m.role, m.layer): m.local for m in mats}
    out["roles"] = sorted({m.role for m in mats})
    hn, nh, ng = 16, 4, 2
    for i in range(2):
        x = seen[("qkv_in", i)].double()  # (s, b, h): the normed input of linear_qkv
        q, k, v = seen[("qkv", i)]
        for name, ref, heads in (("qkv.q", q, nh), ("qkv.k", k, ng), ("qkv.v", v, ng)):
            mine = (x @ roles[(name, i)].double().T).view(16, 2, heads, hn)
            out["split_err"] = max(out["split_err"], float((mine - ref.double()).abs().max()))
        gate = torch.sigmoid(x @ roles[("gate", i)].double().T)
        gated = seen[("core_out", i)].double() * gate
        out["gate_err"] = max(out["gate_err"], float((gated - seen[("proj_in", i)]).abs().max()))
        # full fp64 softmax of the captured q, k (GQA: head h reads group h // 2)
        ref_heads = []
        causal = torch.ones(16, 16, dtype=torch.bool).tril()
        for h in range(nh):
            share = 0.0
            for b in range(2):
                s = (q[:, b, h].double() @ k[:, b, h // 2].double().T) / math.sqrt(hn)
                p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
                share += float(p[1:, 0].sum())
            ref_heads.append(share / (2 * 15))
        for h, ref in enumerate(ref_heads):
            got = acts[f"sink_share/layer_{i:02d}/head_{h:02d}"]
            out["sink_err"] = max(out["sink_err"], abs(got - ref))
    weights = weight_diagnostics([model], None)
    for m in mats:
        key = f"stable_rank/{m.role}" + (f"/layer_{m.layer:02d}" if m.layer is not None else "")
        w = m.local.double()
        exact = float(w.pow(2).sum()) / float(torch.linalg.matrix_norm(w, ord=2)) ** 2
        out["stable_rank_rel_err"] = max(
            out["stable_rank_rel_err"], abs(weights[key] - exact) / exact
        )
    out["norm_keys"] = sorted(k for k in acts if k.startswith("norm_saturated/"))
    out["norm_eps"] = sorted({s.eps for s in probe.norm_stats.values()})
    out["norm_tokens"] = sorted({s.tokens for s in probe.norm_stats.values()})
    parallel.destroy()
    print(json.dumps(out))


def reference(ckpt: str, prefix: str, seq: int, num: int) -> None:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from megatron_gamma.diagnostics.compare import token_windows
    from megatron_gamma.rundir import loader

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    plain = dist_checkpointing.load_plain_tensors(ckpt)
    dist.destroy_process_group()
    ranks = {}
    for name in ("linear_proj.weight", "linear_fc2.weight"):
        stacked = (
            plain[f"decoder.layers.self_attention.{name}"]
            if "proj" in name
            else (plain[f"decoder.layers.mlp.{name}"])
        )
        for layer, w in enumerate(stacked.double()):
            sigma = float(torch.linalg.matrix_norm(w, ord=2))
            ranks[f"{name.split('.')[0]}/layer_{layer:02d}"] = float(w.pow(2).sum()) / sigma**2
    cfg = loader.run_config(ckpt)
    windows = token_windows(prefix, num, seq)
    with loader.single_process(cfg):
        model = loader.model_for_run(cfg, ckpt)
        loader.load_weights(model, ckpt)
        with torch.no_grad():
            positions = torch.arange(seq).unsqueeze(0).expand(windows.size(0), -1)
            loss = model(windows[:, :-1], positions, None, labels=windows[:, 1:])
    print(json.dumps({"stable_rank": ranks, "mean_loss": float(loss.double().mean())}))


def tensor_parallel(run_dir: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    from megatron_gamma.diagnostics.callback import DiagnosticsCallback
    from megatron_gamma.rundir import layout, loader
    from megatron_gamma.training.loop import Trainer

    cfg = loader.run_config(run_dir, run_dir=run_dir).replace(
        tensor_model_parallel_size=2,
        save=os.path.join(out_dir, "checkpoints"),
        run_dir=out_dir,
        log_diagnostics_interval=0,
    )
    trainer = Trainer(cfg)
    ckpt = layout.resolve_checkpoint(run_dir)
    trainer.state.iteration = loader.load_model_weights([trainer.chunks[0].module], ckpt)
    values = DiagnosticsCallback(1).collect(trainer)
    trainer.save()
    if dist.get_rank() == 0:
        values["iteration"] = trainer.state.iteration
        with open(os.path.join(out_dir, "diagnostics.json"), "w") as f:
            json.dump(values, f)
    trainer.close()


if __name__ == "__main__":
    if sys.argv[1] == "model":
        main(sys.argv[2])
    elif sys.argv[1] == "tp":
        tensor_parallel(sys.argv[2], sys.argv[3])
    else:
        reference(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))

"""Megatron-LM's MoE flags reach megatron-core's TransformerConfig and modules; mixed dense/MoE
layers (``--moe-layer-freq``) and shared experts are built, gamma-initialized and counted.

References: the built model's own config and modules, ``numel`` of the real model (for the
estimator), and the closed-form sigma = fan_in^-1 of the paper's rule (for the shared experts).
"""

from __future__ import annotations

import pytest
import torch
from distributed import run_distributed
from helpers import pretrain

from megatron_gamma.config import ConfigError, load_config, moe_layer_pattern

MIXED = dict(
    num_layers=4,
    hidden_size=64,
    ffn_hidden_size=256,  # the dense layer's width in the closed-form FLOPs below
    num_attention_heads=4,
    seq_length=16,
    vocab_size=256,
    num_experts=4,
    moe_ffn_hidden_size=32,
    moe_shared_expert_intermediate_size=48,
    moe_layer_freq="([0]*1+[1]*3)",
)
FLAGS = dict(
    moe_router_load_balancing_type="seq_aux_loss",
    moe_z_loss_coeff=1e-3,
    moe_router_score_function="sigmoid",
    moe_expert_capacity_factor=1.5,
    moe_pad_expert_input_to_capacity=True,
    moe_router_dtype="fp64",
)


def test_layer_freq_follows_megatron_lm():
    assert moe_layer_pattern("1", 4) == [1, 1, 1, 1]
    assert moe_layer_pattern("2", 5) == [1, 0, 1, 0, 1]
    assert moe_layer_pattern("([0]*1+[1]*3)", 4) == [0, 1, 1, 1]
    assert moe_layer_pattern("[1,0]*2", 4) == [1, 0, 1, 0]
    with pytest.raises(ConfigError, match=r"moe_layer_freq='\[0\]\*3'.*num_layers=4"):
        moe_layer_pattern("[0]*3", 4)
    with pytest.raises(ConfigError, match="moe_layer_freq=.*not an integer"):
        moe_layer_pattern("__import__('os')", 4)
    assert moe_layer_pattern("2*[0,1]", 4) == [0, 1, 0, 1]
    for huge in ("[1]*999999999999", "[[1]*999999999999]", "[1]*(99999*99999)"):
        # refused before the list is built (it would fill memory), as longer than the model
        with pytest.raises(ConfigError, match=r"a list longer than num_layers=4"):
            moe_layer_pattern(huge, 4)
    assert load_config(None, {**MIXED, "moe_layer_freq": 2}).model.moe_layer_freq == "2"


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"moe_z_loss_coeff": 1e-3}, "moe_z_loss_coeff=0.001: needs an MoE model"),
        ({"moe_layer_freq": "2"}, "moe_layer_freq='2': needs an MoE model"),
        ({**MIXED, "moe_grouped_gemm": True}, "moe_grouped_gemm=True: .*grouped_gemm"),
        ({**MIXED, "moe_pad_expert_input_to_capacity": True}, "needs a capacity"),
        (
            {
                **MIXED,
                "moe_expert_capacity_factor": 1.0,
                "moe_router_load_balancing_type": "sinkhorn",
            },
            "moe_expert_capacity_factor=1.0: megatron-core drops tokens only",
        ),
        ({**MIXED, "moe_router_dtype": "fp16"}, "moe_router_dtype='fp16': unknown"),
        ({**MIXED, "moe_shared_expert_intermediate_size": 0}, "must be >= 1"),
    ],
)
def test_bad_moe_settings_are_named(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def _built(tp: int) -> dict:
    """Build the mixed model under TP = ``tp``: its config, MLP kinds, numel vs. the estimator,
    and the shared experts' measured sigma."""
    from workers.common import build, gather_global, make_config

    from megatron_gamma.estimate import count_parameters, params_per_gpu
    from megatron_gamma.model.flops import forward_flops_per_token

    cfg = make_config(
        {**MIXED, **FLAGS}, {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1}
    )
    models, vocab = build(cfg)
    model = models[0]
    c = model.config
    glob = gather_global(models)
    return {
        "config": {k: getattr(c, k) for k in ("moe_layer_freq", *FLAGS)}
        | {"moe_shared_expert_intermediate_size": c.moe_shared_expert_intermediate_size},
        "kinds": [type(layer.mlp).__name__ for layer in model.decoder.layers],
        "local_numel": sum(p.numel() for p in model.parameters()),
        "estimated_local": params_per_gpu(cfg, vocab)["first"],
        "estimated_total": count_parameters(cfg, vocab).total,
        "flops": forward_flops_per_token(cfg, vocab),
        "shared_sigma": {
            k: float(v.double().std(unbiased=False)) for k, v in glob.items() if "shared" in k
        },
        "vocab": vocab,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_flags_reach_megatron_core_and_the_estimator_counts_the_model():
    one = run_distributed(_built, 1, 1)[0]
    two = run_distributed(_built, 2, 2)[0]
    assert one["config"] == {
        "moe_layer_freq": [0, 1, 1, 1],
        **FLAGS,
        "moe_shared_expert_intermediate_size": 48,
    }
    assert one["kinds"] == ["MLP", "MoELayer", "MoELayer", "MoELayer"]
    assert one["local_numel"] == one["estimated_local"] == one["estimated_total"]
    assert two["local_numel"] == two["estimated_local"]
    # Closed-form forward FLOPs per token: h=64, 4 heads of 16, s=16, f=256, 4 experts top-2 of
    # width 32, shared width 48, SwiGLU, elementwise gate, V=vocab.
    h, s, f, fe, fs, v = 64, 16, 256, 32, 48, one["vocab"]
    attn = 2 * h * 3 * h + 2 * h * h + 2 * h * s + 2 * h * h
    dense = 2 * h * f * 2 + 2 * f * h
    moe = 2 * h * 4 + 2 * (2 * h * fe * 2 + 2 * fe * h) + 2 * h * fs * 2 + 2 * fs * h
    assert one["flops"] == 4 * attn + dense + 3 * moe + 2 * h * v
    assert len(one["shared_sigma"]) == 6  # fc1 and fc2 of three MoE layers
    for key, sigma in one["shared_sigma"].items():
        fan_in = 64 if "linear_fc1" in key else 48
        assert sigma == pytest.approx(fan_in**-1.0, rel=0.05), key
    assert two["shared_sigma"] == pytest.approx(one["shared_sigma"], rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_moe_run_with_every_flag_trains(tmp_path, demo_prefix):
    flags = ["--train-iters", "3", "--eval-interval", "100", "--num-experts", "4"]
    flags += ["--moe-shared-expert-intermediate-size", "64", "--moe-layer-freq", "[0,1]"]
    for key, value in FLAGS.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    losses = pretrain(tmp_path, demo_prefix, *flags)["train"]
    assert sorted(losses) == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mixed_layers_under_pp2_train_like_one_rank(tmp_path, demo_prefix):
    """PP2 puts the dense layer 0 and the MoE layer 1 on different stages (each stage picks its
    layers' specs from its global offset): losses and grad norms equal the single rank's."""
    flags = ["--train-iters", "4", "--eval-interval", "100", "--num-experts", "4"]
    flags += ["--moe-layer-freq", "[0,1]", "--moe-shared-expert-intermediate-size", "64"]
    ref = pretrain(tmp_path / "one", demo_prefix, *flags)
    got = pretrain(
        tmp_path / "pp2", demo_prefix, *flags, "--pipeline-model-parallel-size", "2", nproc=2
    )
    for it in range(1, 5):
        for key in ("train", "grad_norm"):
            assert got[key][it] == pytest.approx(ref[key][it], rel=1e-5), (key, it)

"""The gamma-initialization rule (paper: sigma = d_in^-gamma) on real megatron-core models."""

import json
import math
import os

import numpy as np
import pytest
import torch
from distributed import run_distributed
from helpers import TINY_MODEL, pretrain, run_cli
from workers.common import build, gather_global, make_config

import megatron_gamma.model.init as init_module
from megatron_gamma import ops
from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.training.init_audit import (
    audit_init,
    format_summary,
    in_scope,
    shard_sums,
    summarize_audit,
)

# Independent of the code under test: the paper's d_in per role for the worker's models
# (hidden 256, 4 heads of 64, ffn 1024, experts of width 512).
D_IN = {
    "embedding": 256,
    "qkv": 256,
    "gate": 256,
    "attn_out": 256,
    "fc1": 256,
    "fc2": 1024,
    "router": 256,
    "expert_fc1": 256,
    "expert_fc2": 512,
    "output": 256,
}


DENSE = dict(num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4)
MOE = dict(DENSE, num_experts=4, moe_ffn_hidden_size=512)
DENSE4 = dict(DENSE, num_layers=4)


def _sigma_cases():
    """Audit rows for dense and MoE models at several gammas, per-role overrides, megatron-core's
    normal init, a deliberately mis-initialized parameter and a wrong role-table fan-in (one
    process)."""
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


def _layout_cases():
    """Global weights and audit rows under TP=2 and 4, PP=2, PP=2 with virtual stages, EP=2 and
    the MoE layouts (TP=2 with EP=1 with and without SP, TP2 x EP2 with expert TP 2 and 1) vs.
    the single-rank layout."""
    tp2 = {"tensor_model_parallel_size": 2}
    vpp = {"pipeline_model_parallel_size": 2, "num_layers_per_virtual_pipeline_stage": 1}
    layouts = {
        "dense-tp2": (DENSE, tp2, 2),
        # The vocabulary padding multiple times TP stays 256, so the embedding's shape matches.
        "dense-tp4": (
            dict(DENSE, make_vocab_size_divisible_by=64),
            {"tensor_model_parallel_size": 4},
            4,
        ),
        "dense4-pp2-vpp": (DENSE4, vpp, 2),
        "dense-pp2": (DENSE, {"pipeline_model_parallel_size": 2}, 2),
        "moe-ep2": (MOE, {"expert_model_parallel_size": 2}, 2),
        # EP = 1 under TP = 2: experts are whole on both ranks (issue 15.1; megatron-core's
        # ``allreduce`` flag says "dense" for them, the registry's expert group does not).
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
    for name, model in (("dense", DENSE), ("moe", MOE), ("dense4", DENSE4)):
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


def _residual_cases():
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

            def keep(key, seen=seen):
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


def _within(row, expected, rel=0.03):
    """|measured/expected - 1| <= rel, or 4 standard errors of a sigma estimated from n samples
    when that is larger (a 4 x 256 router has 1024 entries: one standard error is 2.2%)."""
    allowed = max(rel, 4 / math.sqrt(2 * row["numel"]))
    return abs(row["measured_sigma"] / expected - 1) <= allowed


def _model_cases() -> dict:
    return {
        "sigma": _sigma_cases(),
        "residual": _residual_cases(),
        "scope": _scope_cases(),
        "summary": _summary_case(),
    }


@pytest.fixture(scope="module")
def model_cases() -> dict:
    """The single-rank model cases of this module, built in one spawned process (one
    megatron-core start-up instead of four): {"sigma", "residual", "scope", "summary"}."""
    return run_distributed(_model_cases, 1)[0]


@pytest.fixture(scope="module")
def sigma_rows(model_cases):
    return model_cases["sigma"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("gamma", [0.5, 1.0, 1.5])
def test_measured_sigma_is_fan_in_to_minus_gamma(sigma_rows, model, gamma):
    rows = sigma_rows[f"{model}-{gamma}"]
    roles = {r["role"] for r in rows}
    assert roles >= {"embedding", "qkv", "gate", "attn_out", "output", "norm"}
    assert roles >= ({"router", "expert_fc1", "expert_fc2"} if model == "moe" else {"fc1", "fc2"})
    for row in rows:
        if row["role"] == "norm":
            assert row["measured_mean"] == 1.0 and row["measured_sigma"] == 0.0
            continue
        expected = D_IN[row["role"]] ** -gamma
        assert row["expected_sigma"] == pytest.approx(expected, rel=1e-12), row["name"]
        assert _within(row, expected), (row["name"], row["measured_sigma"], expected)
        assert abs(row["measured_mean"]) < 4 * expected / math.sqrt(row["numel"]), row["name"]
        if row["numel"] >= 4096:
            assert abs(row["measured_sigma"] / expected - 1) <= 0.03, row["name"]


@pytest.mark.timeout(300)
def test_overrides_and_megatron_normal_baseline(sigma_rows):
    for row in sigma_rows["overrides"]:
        gamma = {"fc2": 0.75, "embedding": 0.5}.get(row["role"], 1.0)
        if row["role"] in D_IN:
            assert _within(row, D_IN[row["role"]] ** -gamma), row["name"]
    for row in sigma_rows["normal"]:
        if row["role"] in D_IN:
            # megatron-core: N(0, 0.02), output layers of each block scaled by 1/sqrt(2 L), L=2.
            std = 0.02 / (2.0 if row["role"] in ("attn_out", "fc2") else 1.0)
            assert _within(row, std), row["name"]


@pytest.mark.timeout(300)
def test_audit_flags_a_mis_initialized_parameter(sigma_rows):
    flagged = [r["name"] for r in sigma_rows["mis-initialized"] if r["flagged"]]
    assert flagged == ["decoder.layers.1.mlp.linear_fc2.weight"]
    for name in ("dense-1.0", "moe-1.0", "normal", "overrides"):
        assert not [r["name"] for r in sigma_rows[name] if r["flagged"]], name


@pytest.mark.timeout(300)
def test_audit_checks_the_role_table_against_each_matrix_shape(sigma_rows):
    """fc2's table fan-in doubled: init and expectation agree (sigma looks right), the shape
    [256, 1024] does not."""
    rows = sigma_rows["wrong-table"]
    flagged = {r["name"]: r for r in rows if r["flagged"]}
    assert sorted(flagged) == [f"decoder.layers.{i}.mlp.linear_fc2.weight" for i in (0, 1)]
    for row in flagged.values():
        assert (row["fan_in"], row["shape_fan_in"]) == (2048, 1024)
        assert _within(row, 2048**-1.0)
    for row in sigma_rows["dense-1.0"]:
        if row["role"] in D_IN:
            assert row["shape_fan_in"] == D_IN[row["role"]], row["name"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_same_weights_bit_for_bit_under_tp_pp_vpp_ep_etp():
    """Global weights (reassembled from megatron-core's own sharding metadata) and the init
    audit equal the single-rank run's under every layout (TP 2 and 4, PP 2, virtual pipeline
    stages, EP 2, expert TP 1 and 2), MoE with TP and EP = 1 included: each rank drew only its
    shard from the counter-based generator."""
    results = run_distributed(_layout_cases, 4)[0]
    assert set(results) == {
        "dense-tp2",
        "dense-tp4",
        "dense4-pp2-vpp",
        "dense-pp2",
        "moe-ep2",
        "moe-tp2",
        "moe-tp2-sp",
        "moe-ep2-tp2-sp",
        "moe-ep2-tp2-etp1",
    }
    for name, r in results.items():
        assert r["keys_equal"], name
        assert r["max_abs_diff"] == 0.0, name
        assert r["sigma"] == r["ref_sigma"], name
        got = {row["name"]: row for row in r["audit"]}
        for ref in r["ref_audit"]:
            row = got.pop(ref["name"])
            assert row["shape"] == ref["shape"], (name, ref["name"])
            assert row["numel"] == ref["numel"], (name, ref["name"])
            assert row["measured_sigma"] == pytest.approx(ref["measured_sigma"], rel=1e-9)
            assert not row["flagged"], (name, ref["name"])
        assert not got, name
    experts = {row["name"]: row["shape"] for row in results["moe-tp2"]["audit"]}
    # Paper-independent ground truth: SwiGLU expert fc1 is [2 x 512, 256], fc2 [256, 512].
    assert experts["decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"] == [1024, 256]
    assert experts["decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"] == [256, 512]


@pytest.mark.timeout(300)
def test_residual_flow_scales_as_d_to_one_minus_gamma(model_cases):
    """Paper, Optimal Initialization Scale: the residual update relative to the embedding
    scales as d^(1-gamma); measured on a real 1-layer model at initialization."""
    ratios = model_cases["residual"]
    for gamma, by_width in ratios.items():
        widths = np.array([float(w) for w in by_width])
        slope = np.polyfit(np.log(widths), np.log(np.array(list(by_width.values()))), 1)[0]
        assert abs(slope - (1 - float(gamma))) <= 0.15, (gamma, slope)


def test_override_errors_name_the_role():
    with pytest.raises(ConfigError, match="init_gamma_overrides='fc3'.*unknown role"):
        load_config(None, {"init_gamma_overrides": "fc3=1.0"})
    with pytest.raises(ConfigError, match="expected ROLE=GAMMA"):
        load_config(None, {"init_gamma_overrides": "fc2"})
    with pytest.raises(ConfigError, match="gamma must be > 0"):
        load_config(None, {"init_gamma_overrides": "fc2=0"})


def _scope_cases():
    """Full and summary audits of one 4-layer model (one process)."""
    cfg = make_config(DENSE4, {})
    models, vocab = build(cfg)
    return audit_init(models, cfg, vocab), audit_init(models, cfg, vocab, scope="summary")


@pytest.mark.timeout(300)
def test_summary_audit_measures_the_outer_and_first_and_last_layers(model_cases):
    full, summary = model_cases["scope"]
    full = {r["name"]: r for r in full}
    names = {r["name"] for r in summary}
    want = {n for n in full if not n.startswith(("decoder.layers.1.", "decoder.layers.2."))}
    assert names == want
    assert {r["role"] for r in summary} == {r["role"] for r in full.values()}
    for row in summary:
        assert row == full[row["name"]]
    with pytest.raises(ValueError, match="init_audit='some'"):
        in_scope("decoder.layers.0.mlp.linear_fc1.weight", "some", 4)


def _summary_case():
    """The per-role summary of a MoE model with one router mis-initialized router, and an fp64
    recomputation from the model's own parameters (one process)."""
    cfg = make_config(MOE, {})
    models, vocab = build(cfg)
    with torch.no_grad():
        models[0].decoder.layers[1].mlp.router.weight.mul_(1.5)
    rows = audit_init(models, cfg, vocab)
    ref: dict[str, list] = {}
    for name, p in models[0].named_parameters():
        x = p.detach().double()
        role = _reference_role(name)
        if role == "norm":
            dev, sigma = max(float(x.std(unbiased=False)), float((x.mean() - 1).abs())), None
        else:
            sigma = float(x.std(unbiased=False))
            dev = abs(sigma / D_IN[role] ** -1.0 - 1)
        ref.setdefault(role, []).append((dev, sigma, name))
    return summarize_audit(rows), format_summary(summarize_audit(rows)), ref


def _reference_role(name: str) -> str:
    """The role of a parameter of the worker's models, from its megatron-core name."""
    if "layernorm" in name:
        return "norm"
    if "local_experts" in name:
        return "expert_fc1" if "linear_fc1" in name else "expert_fc2"
    for role, part in (
        ("embedding", "word_embeddings"),
        ("qkv", "linear_qkv"),
        ("gate", "linear_gate"),
        ("attn_out", "linear_proj"),
        ("router", "router"),
        ("output", "output_layer"),
        ("fc1", "linear_fc1"),
        ("fc2", "linear_fc2"),
    ):
        if part in name:
            return role
    raise AssertionError(name)


@pytest.mark.timeout(300)
def test_audit_summary_equals_an_fp64_recomputation_per_role(model_cases):
    summary, text, ref = model_cases["summary"]
    by_role = {r["role"]: r for r in summary}
    assert set(by_role) == set(ref)
    for role, members in ref.items():
        row = by_role[role]
        dev, sigma, name = max(members)
        assert row["count"] == len(members), role
        assert row["worst_deviation"] == pytest.approx(dev, rel=1e-9, abs=1e-12), role
        if sigma is not None:  # norms are all exactly one: every one of them is the worst
            assert row["worst_name"] == name, role
            assert row["fan_in"] == D_IN[role]
            assert row["expected_sigma"] == pytest.approx(D_IN[role] ** -1.0, rel=1e-12)
            assert row["worst_sigma"] == pytest.approx(sigma, rel=1e-9), role
    assert by_role["router"]["flagged"] == 1
    assert by_role["router"]["worst_deviation"] == pytest.approx(0.5, abs=0.1)
    assert sum(r["flagged"] for r in summary) == 1
    assert len(text.splitlines()) == 2 + len(summary)


@pytest.mark.parametrize("backend", ["reference", "extension"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_streamed_sums_equal_fp64_sums(backend, dtype):
    """Both paths of shard_sums (torch float64 chunks; the C++ ``moments`` kernel, whose 2^16
    blocks and 32 partial sums this size spans, with a ragged tail) against fp64 sums."""
    if backend == "extension" and ops.backend("cpu") != "extension":
        pytest.skip(f"extension not built: {ops.extension_status()}")
    x = torch.randn(70001, 3, generator=torch.Generator().manual_seed(0)).mul_(3).add_(1)
    x = x.to(dtype)
    with ops.use_backend(backend):
        total, squares = shard_sums(x, chunk=4096)
    ref = x.double()
    assert total == pytest.approx(float(ref.sum()), rel=1e-12)
    assert squares == pytest.approx(float((ref * ref).sum()), rel=1e-12)


def test_init_audit_choice_is_validated():
    assert load_config(None, {"init_audit": "summary"}).init.init_audit == "summary"
    with pytest.raises(ConfigError, match="init_audit"):
        load_config(None, {"init_audit": "partial"})


def test_a_resume_names_the_runs_init_audit_only_where_it_exists(tmp_path, capsys):
    """A resume into a new --run-dir said the run's audit "stays in RUN/init_audit.json" where
    no such file was ever written: the file is named only where it exists."""
    from types import SimpleNamespace

    from megatron_gamma.training.loop import Trainer

    run = tmp_path / "run"
    os.makedirs(run)
    trainer = SimpleNamespace(
        cfg=load_config(None, {"init_audit": "summary"}),
        rank=0,
        weights_from="/ckpt",
        _resumes=lambda: True,
        takeover=None,
    )
    head = (
        "init audit: not measured on a resume (the weights of /ckpt replace the initialization); "
    )
    assert Trainer._audit_init(trainer, str(run)) == []
    assert capsys.readouterr().out == (
        f"{head}the audit of the run's start is not in this run directory ({run}): it was "
        "written, if at all, in the run directory that started the run\n"
    )
    (run / "init_audit.json").write_text("[]")
    assert Trainer._audit_init(trainer, str(run)) == []
    assert capsys.readouterr().out == (
        f"{head}the run's own audit, from its start, stays in {run / 'init_audit.json'}\n"
    )
    trainer.takeover = "run_dir=...: held a run that never finished an iteration"  # moved aside
    assert Trainer._audit_init(trainer, str(run)) == []
    assert "the audit of the run's start is not in this run directory" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_init_audit_flag_through_the_cli(tmp_path, demo_prefix):
    """--init-audit summary writes the outer and first/last layers' rows; off writes none."""
    flags = ["--train-iters", "1", "--eval-interval", "100", "--num-layers", "4"]
    pretrain(tmp_path / "summary", demo_prefix, *flags, "--init-audit", "summary")
    with open(tmp_path / "summary" / "init_audit.json") as f:
        names = [r["name"] for r in json.load(f)]
    layers = {int(n.split(".")[2]) for n in names if n.startswith("decoder.layers.")}
    assert layers == {0, 3}
    assert "embedding.word_embeddings.weight" in names
    pretrain(tmp_path / "off", demo_prefix, *flags, "--init-audit", "off")
    assert not os.path.exists(tmp_path / "off" / "init_audit.json")
    assert os.path.isfile(tmp_path / "off" / "config.yaml")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_resume_keeps_its_runs_init_audit_and_a_fresh_start_sets_an_earlier_one_aside(
    tmp_path, demo_prefix
):
    """--init-audit off writes no audit: a resume keeps the audit its run wrote at iteration 0
    (and its analysis/), a fresh start in the same directory moves the earlier run's aside."""
    run, save = tmp_path / "run", tmp_path / "ckpt"

    def pretrain_here(*flags):
        args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(run), *TINY_MODEL]
        proc = run_cli([*args, "--train-iters", "2", "--eval-interval", "100", *flags])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        return proc.stdout

    pretrain_here("--save", str(save), "--exit-interval", "1", "--init-audit", "summary")
    audit = (run / "init_audit.json").read_bytes()
    assert "embedding.word_embeddings.weight" in {r["name"] for r in json.loads(audit)}
    os.makedirs(run / "analysis")
    (run / "analysis" / "analysis.json").write_text('{"runs": []}')  # as analyze writes it

    out = pretrain_here("--save", str(save), "--load", str(save), "--init-audit", "off")
    assert "resumed at iteration 1" in out and "superseded" not in out
    assert (run / "init_audit.json").read_bytes() == audit
    assert (run / "analysis" / "analysis.json").read_text() == '{"runs": []}'

    out = pretrain_here("--save", str(tmp_path / "ckpt2"), "--overwrite", "--init-audit", "off")
    aside = run / "init_audit.superseded-1.json"
    assert (
        f"{run / 'init_audit.json'}: the init audit of an earlier run moved to {aside}; this run "
        "starts afresh"
    ) in out
    assert f"{run / 'analysis'}: the analysis of an earlier run moved to" in out
    assert not (run / "init_audit.json").exists() and aside.read_bytes() == audit
    assert not (run / "analysis").exists()
    assert (run / "analysis.superseded-1" / "analysis.json").read_text() == '{"runs": []}'

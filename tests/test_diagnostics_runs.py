"""Diagnostics on real runs of the demo: live callback, ``analyze``, ``compare``, and TP=2.

One module-scoped tiny demo run (2 layers, hidden 64, GQA 4 heads / 2 groups, 6 iterations,
checkpoints at 2, 4, 6, diagnostics every iteration) feeds most tests; every command runs in
its own process, as users run it. References: an exact float64 SVD of weights read by
megatron-core's ``load_plain_tensors``, megatron-core's own LM loss, the live callback's values
for the same weights, and a TP=2 run (slow test) against the TP=1 run.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, check_nproc, cli_command, cli_env, close, read_diagnostics, run_cli
from scipy import stats as scipy_stats
from test_diagnostics import check_headline, cr2_by_matrix

from megatron_gamma.rundir.paths import ANALYSIS_FILES

DEMO = os.path.join(REPO, "megatron_gamma", "data", "demo")
CHECK = os.path.join(REPO, "tests", "diagnostics_model_check.py")
MODEL_ARGS = [
    "--config", os.path.join(REPO, "examples", "configs", "demo.yaml"),
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "256",
    "--num-query-groups", "2", "--seq-length", "64",
    "--no-progress-bar",
]  # fmt: skip


def _run(args: list[str], timeout: int = 120) -> str:
    proc = subprocess.run(
        args, env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def _cli(*args: str, timeout: int = 120) -> str:
    return _run(cli_command(list(args)), timeout)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("diag")
    prefix = str(root / "data" / "demo")
    _cli(
        "preprocess", "--input", os.path.join(DEMO, "zh.jsonl"), os.path.join(DEMO, "en.jsonl"),
        "--tokenizer-model", os.path.join(DEMO, "tokenizer.json"), "--output-prefix", prefix,
        "--no-progress",
    )  # fmt: skip
    data = prefix + "_text_document"
    run = str(root / "run")
    _cli(
        "pretrain", *MODEL_ARGS, "--data-path", data, "--run-dir", run, "--train-iters", "6",
        "--save-interval", "2", "--save", os.path.join(run, "checkpoints"), "--eval-interval", "3",
        "--log-diagnostics-interval", "1",
        timeout=240,
    )  # fmt: skip
    return {"root": root, "data": data, "run": run}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_callback_logs_every_diagnostic(demo):
    diag = read_diagnostics(demo["run"])
    assert sorted(diag) == [0, 1, 2, 3, 4, 5, 6]  # iteration 0: the initialized model
    rec = diag[6]
    roles = ["qkv.q", "qkv.k", "qkv.v", "gate", "attn_out", "fc1.gate", "fc2"]
    for layer in (0, 1):
        for role in roles:
            assert rec[f"stable_rank/{role}/layer_{layer:02d}"] >= 1.0
            assert 0.0 <= rec[f"condensation/{role}/layer_{layer:02d}"] <= 1.0
        assert 0.0 < rec[f"sink_share/layer_{layer:02d}"] < 1.0
        assert sorted(k for k in rec if k.startswith(f"sink_share/layer_{layer:02d}/")) == [
            f"sink_share/layer_{layer:02d}/head_{h:02d}" for h in range(4)
        ]
        assert rec[f"norm_saturated/input_layernorm/layer_{layer:02d}"] == 0.0  # eps = 1e-12
    assert "stable_rank/embedding" in rec and "stable_rank/output" in rec
    for layer in (0, 1):  # the elementwise gates of megatron_gamma.model.gated_attention
        assert 0.0 < rec[f"gate_mean/layer_{layer:02d}"] < 1.0
        assert 0.0 <= rec[f"gate_closed/layer_{layer:02d}"] <= 1.0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(demo["run"], "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "diagnostics/stable_rank/qkv.q/layer_00" in tags
    assert "diagnostics/sink_share/layer_01" in tags
    steps = [e.step for e in acc.Scalars("diagnostics/norm_log10_ms_p50/final_layernorm")]
    assert steps == [0, 1, 2, 3, 4, 5, 6]


def _png_panels(path: str) -> list[str]:
    from PIL import Image

    assert os.path.getsize(path) > 10_000, path
    with Image.open(path) as im:
        assert im.size[0] > 600 and im.size[1] > 300
        extrema = im.convert("L").getextrema()
        assert extrema[0] < extrema[1]  # not a blank image
        return json.loads(im.text["Panels"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_analyze_writes_plots_and_numbers_matching_references(demo):
    run = demo["run"]
    out = _cli("analyze", run, "--no-progress", timeout=240)
    adir = os.path.join(run, "analysis")
    for name in ("stable_rank", "condensation", "attention_sink", "norm_saturation"):
        assert f"wrote {name}: {os.path.join(adir, name + '.png')}" in out
    assert f"wrote gates: {os.path.join(adir, 'gates.png')}" in out
    # a rerun replaces it
    assert [n for n in os.listdir(adir) if not ANALYSIS_FILES.fullmatch(n)] == []
    panels = _png_panels(os.path.join(adir, "stable_rank.png"))
    assert panels == [
        "input embedding", "attention W_QKV (q)", "attention W_QKV (k)", "attention W_QKV (v)",
        "attention output gate W_G", "attention output W_O", "MLP fc1 (gate)", "MLP fc1 (up)",
        "MLP fc2", "output layer",
    ]  # fmt: skip
    assert _png_panels(os.path.join(adir, "condensation.png")) == panels
    assert _png_panels(os.path.join(adir, "attention_sink.png")) == [
        "Attention-sink share per layer (mean over heads)",
        "per head at iteration 6",
    ]
    assert [p[:3] for p in _png_panels(os.path.join(adir, "norm_saturation.png"))] == [
        "(a)", "(b)", "(c)",
    ]  # fmt: skip
    # default heatmaps: q and SwiGLU gate of the first and last layer, at 4 iterations
    heat = _png_panels(os.path.join(adir, "cosine_heatmaps.png"))
    assert len(heat) == 16 and heat[0].startswith("iteration 0\n")

    doc = json.load(open(os.path.join(adir, "analysis.json")))
    (res,) = doc["runs"]
    assert res["iterations"] == [0, 2, 4, 6]
    # the printed table and the summary's headline equal the numbers of analysis.csv
    check_headline(out, os.path.join(adir, "analysis.json"), os.path.join(adir, "analysis.csv"))
    metrics = res["metrics"]
    with open(os.path.join(adir, "analysis.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(len([v for v in s if v is not None]) for s in metrics.values())
    assert {r["iteration"] for r in rows} == {"0", "2", "4", "6"}

    # offline (checkpoint -> single-rank model) equals live (in-memory weights, same batch);
    # iteration 0: the model rebuilt from the config equals the live diagnostics at init. The
    # condensation score samples the same 128 rows of each matrix in both (trial 7: analyze
    # sampled 512, so the embedding's score differed between the two under one name)
    live = read_diagnostics(run)
    checked = 0
    for key, series in metrics.items():
        if key.startswith(("stable_rank/", "top_share/", "sink_share/", "norm_", "condensation/")):
            for it, value in zip(res["iterations"], series, strict=True):
                expected = live[it][key]
                assert close(value, expected), (key, it, value, expected)
                checked += 1
    assert checked > 200

    # independent reference: exact fp64 SVD of weights read by load_plain_tensors
    ckpt = os.path.join(run, "checkpoints", "iter_0000006")
    ref = json.loads(_run([sys.executable, CHECK, "reference", ckpt, demo["data"], "64", "16"]))
    for name, value in ref["stable_rank"].items():
        role = {"linear_proj": "attn_out", "linear_fc2": "fc2"}[name.split("/")[0]]
        got = metrics[f"stable_rank/{role}/{name.split('/')[1]}"][-1]
        assert got == pytest.approx(value, rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_checkpoints(demo):
    ckpts = os.path.join(demo["run"], "checkpoints")
    a, b = os.path.join(ckpts, "iter_0000006"), os.path.join(ckpts, "iter_0000002")
    out_dir = str(demo["root"] / "compare")
    args = ["--data-path", demo["data"], "--num-sequences", "16", "--no-progress"]
    out = _cli("compare", a, b, *args, "--output-dir", out_dir, "--num-bins", "5", timeout=240)
    summary = json.load(open(os.path.join(out_dir, "compare.json")))
    assert summary["tokens"] == 16 * 64 and summary["seq_length"] == 64
    assert sum(b["count"] for b in summary["bins"]) == summary["tokens"]
    with open(os.path.join(out_dir, "delta_sym_by_difficulty.csv")) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 5 and sum(int(r["count"]) for r in table) == 16 * 64
    panels = _png_panels(os.path.join(out_dir, "delta_sym_by_difficulty.png"))
    assert panels[0].startswith("Symmetric probability gap by token difficulty")
    import numpy as np

    tok = np.load(os.path.join(out_dir, "tokens.npz"))
    pa, pb = np.exp(tok["logp_a"].astype(np.float64)), np.exp(tok["logp_b"].astype(np.float64))
    np.testing.assert_allclose(tok["delta_sym"], (pa - pb) / (pa + pb), rtol=1e-6, atol=1e-12)
    # the document of every target token (windows of 64 + 1 tokens, documents concatenated)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(demo["data"])
    owner = np.repeat(np.arange(len(ds)), ds.sequence_lengths)
    np.testing.assert_array_equal(tok["document"], owner[1 : 16 * 64 + 1].reshape(16, 64))
    # the headline interval is clustered by document (CR2, t with the Bell–McCaffrey df), by
    # hand from the matrices
    x, docs = tok["delta_sym"].astype(np.float64).ravel(), tok["document"].ravel()
    var, df = cr2_by_matrix(x, docs)
    half = scipy_stats.t.ppf(0.975, df) * np.sqrt(var)
    assert summary["documents"] == np.unique(docs).size
    assert summary["mean_delta_sym_df"] == pytest.approx(df, rel=1e-9)
    assert summary["mean_delta_sym_interval"] == pytest.approx([x.mean() - half, x.mean() + half])
    assert "regression to the mean" in summary["caveats"]
    # the console line names A and B and says what the sign of delta_sym means (trial 15 #8)
    lines = out.splitlines()
    assert (
        f"A = {summary['a']['label']}: {a}" in lines
        and f"B = {summary['b']['label']}: {b}" in lines
    )
    assert summary["a"]["label"].startswith("run iter 6 (")
    (line,) = [ln for ln in lines if ln.startswith(f"{16 * 64} tokens of ")]
    assert f"mean delta_sym {x.mean():+.4f} [{x.mean() - half:+.4f}, " in line
    assert line.endswith("per token: negative = B better, positive = A better")
    # megatron-core's own loss on the same windows, from the same checkpoint
    ref = json.loads(_run([sys.executable, CHECK, "reference", a, demo["data"], "64", "16"]))
    assert summary["a"]["mean_loss"] == pytest.approx(ref["mean_loss"], rel=1e-6)
    # the same checkpoint twice: Delta_sym is 0 on every token (a run directory resolves to
    # its newest checkpoint, iter 6)
    same_dir = str(demo["root"] / "compare_same")
    _cli("compare", a, demo["run"], *args, "--output-dir", same_dir, timeout=240)
    same = np.load(os.path.join(same_dir, "tokens.npz"))
    assert np.all(same["delta_sym"] == 0)
    np.testing.assert_array_equal(same["logp_a"], tok["logp_a"])


@pytest.mark.timeout(180)
def test_probes_on_a_real_model(tmp_path):
    """QKV(+gate) split against megatron-core's own q/k/v and output gate, stable ranks against
    exact SVD, sink share against a full fp64 softmax (see tests/diagnostics_model_check.py)."""
    got = json.loads(_run([sys.executable, CHECK, "model", str(tmp_path)]).splitlines()[-1])
    assert got["split_err"] < 1e-5 and got["gate_err"] < 1e-5
    assert got["stable_rank_rel_err"] < 1e-9
    assert got["sink_err"] < 1e-7  # float32 scores vs the float64 reference
    assert got["roles"] == [
        "attn_out", "embedding", "fc1.gate", "fc1.up", "fc2", "gate", "output", "pos_embedding",
        "qkv.k", "qkv.q", "qkv.v",
    ]  # fmt: skip
    assert got["norm_keys"] == [
        "norm_saturated/final_layernorm",
        "norm_saturated/input_layernorm/layer_00",
        "norm_saturated/input_layernorm/layer_01",
        "norm_saturated/pre_mlp_layernorm/layer_00",
        "norm_saturated/pre_mlp_layernorm/layer_01",
    ]
    assert got["norm_eps"] == [1e-12] and got["norm_tokens"] == [32]


@pytest.mark.slow
def test_cli_errors_are_clear(demo, tmp_path):
    proc = run_cli(["analyze", str(tmp_path / "missing")], timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    out = tmp_path / "heat"  # a role the model has no matrix of gave an empty heatmaps.npz
    args = ["analyze", demo["run"], "--heatmaps", "qkv.z/layer_00", "--output-dir", str(out)]
    proc = run_cli([*args, "--data-path", demo["data"]], timeout=300, cwd=REPO)
    assert proc.returncode == 2
    refusal = "heatmap=qkv.z/layer_00: the run's model has no 'qkv.z' matrix. Fix: use one of "
    assert refusal in proc.stderr and "qkv.q" in proc.stderr.split(refusal)[1]
    assert not (out / "heatmaps.npz").exists()
    args = ["compare", str(tmp_path), demo["run"], "--data-path", demo["data"]]
    proc = run_cli([*args, "--output-dir", str(tmp_path / "o")], timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "no complete checkpoint found" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_analyze_writes_its_dataset_caches_where_the_user_says(demo, tmp_path):
    """A checkpoint's config records the data cache its training used (``--data-cache-path``,
    possibly anywhere on the host that trained it); analyze made that directory and wrote
    megatron-core's index caches into it. It writes them under the run directory it was given,
    or where ``--data-cache-path`` says."""
    run, recorded = str(tmp_path / "run"), tmp_path / "recorded_cache"
    _cli(
        "pretrain", *MODEL_ARGS, "--data-path", demo["data"], "--run-dir", run,
        "--train-iters", "1", "--save", os.path.join(run, "checkpoints"),
        "--data-cache-path", str(recorded),
        timeout=240,
    )  # fmt: skip
    assert any(n.endswith("GPTDataset-valid-sample_index.npy") for n in os.listdir(recorded))
    os.rename(recorded, tmp_path / "training_cache")
    _cli("analyze", run, "--no-progress", "--no-init")
    assert not recorded.exists()
    names = os.listdir(os.path.join(run, "data_cache"))
    assert any(n.endswith("GPTDataset-valid-sample_index.npy") for n in names), names
    chosen = tmp_path / "chosen"
    _cli("analyze", run, "--no-progress", "--no-init", "--data-cache-path", str(chosen))
    assert sorted(os.listdir(chosen)) == sorted(names) and not recorded.exists()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_tensor_parallel_diagnostics_equal_single_rank(demo):
    """TP=2 (2 processes, gloo) on the TP=1 run's iteration-6 weights (resharded by
    dist_checkpointing): sharded stable ranks, assembled row samples, gathered heads, and the
    analysis of the TP=2-saved checkpoint equal the TP=1 run's live values."""
    out = str(demo["root"] / "run_tp2")
    check_nproc(2)
    _run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", CHECK, "tp", demo["run"], out,
        ],
        timeout=360,
    )  # fmt: skip
    tp2 = json.load(open(os.path.join(out, "diagnostics.json")))
    assert tp2.pop("iteration") == 6
    tp1 = read_diagnostics(demo["run"])[6]
    keys = set(tp1) - {"iteration", "split", "diagnostics_seconds", "time"}
    assert set(tp2) == keys
    for key in sorted(keys):
        assert close(tp2[key], tp1[key]), (key, tp2[key], tp1[key])
    _cli("analyze", out, "--no-progress", "--no-init", timeout=240)
    (res,) = json.load(open(os.path.join(out, "analysis", "analysis.json")))["runs"]
    assert res["iterations"] == [6]
    for key, (value,) in res["metrics"].items():
        if key.startswith(("stable_rank/", "sink_share/", "norm_")):
            assert close(value, tp1[key]), (key, value, tp1[key])


def _validation_batches(run_dir: str, prefix: str) -> dict[str, dict]:
    """The first batch training's validation pass feeds the model (``Trainer.evaluate``, seen
    at ``forward_only``), the live diagnostics' batch and analyze's, for one config (document
    masks on: ``--reset-attention-mask``)."""
    import itertools

    from megatron_gamma.config import load_config
    from megatron_gamma.diagnostics.analyze import _validation_batch
    from megatron_gamma.diagnostics.callback import DiagnosticsCallback
    from megatron_gamma.training.loop import Trainer

    overrides = {"data_path": [prefix], "run_dir": run_dir, "num_layers": 1, "hidden_size": 32}
    overrides.update(num_attention_heads=2, seq_length=16, micro_batch_size=3, seed=7)
    overrides.update(global_batch_size=3, train_iters=1, split="90,10,0", init_audit="off")
    overrides.update(eval_iters=1, progress_bar=False, reset_attention_mask=True)
    cfg = load_config(None, overrides)
    trainer = Trainer(cfg)
    seen = []
    forward_only = trainer.forward_only

    def first_batch(batch_iter, num_microbatches=None):
        first = next(batch_iter)
        seen.append(first)
        return forward_only(itertools.chain([first], batch_iter), num_microbatches)

    try:
        trainer.forward_only = first_batch
        trainer.evaluate()
        live = DiagnosticsCallback._validation_batch(trainer)
        offline = _validation_batch(cfg, cfg.training.micro_batch_size)
    finally:
        trainer.close()
    batches = {"training": seen[0], "live": live, "analyze": offline}
    # numpy copies: tensors would travel through shared memory that dies with this process
    return {name: {k: v.numpy() for k, v in b.items()} for name, b in batches.items()}


@pytest.mark.timeout(300)
def test_analyze_uses_the_validation_batch_of_training(tmp_path, demo_prefix):
    from distributed import run_distributed

    (batches,) = run_distributed(_validation_batches, 1, str(tmp_path / "run"), demo_prefix)
    training = batches["training"]
    assert sorted(training) == ["attention_mask", "labels", "loss_mask", "position_ids", "tokens"]
    assert training["tokens"].shape == (3, 16)
    for name in ("live", "analyze"):
        assert sorted(batches[name]) == sorted(training), name
        for key, value in training.items():
            assert batches[name][key].dtype == value.dtype, (name, key)
            assert (batches[name][key] == value).all(), (name, key)

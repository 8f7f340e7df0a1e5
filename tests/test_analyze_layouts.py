"""``analyze`` and ``compare`` on runs saved under EP=2 (MoE) and PP=2 x VPP=2 (issue 15.6), and
the MoE experts' and router's diagnostics, live and offline.

Each run trains on 2 gloo processes with live diagnostics; the offline analysis of its
checkpoints (a single-rank model built from the run's config through the validated
constructor) must equal the live values computed on the sharded model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import TINY_MODEL, close, read_diagnostics, run_cli

LAYOUTS = {
    "moe-ep2": ["--num-experts", "4", "--moe-ffn-hidden-size", "64",
                "--expert-model-parallel-size", "2"],
    "pp2-vpp2": ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                 "--num-layers-per-virtual-pipeline-stage", "1"],
}  # fmt: skip


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, tmp_path_factory, demo_prefix):
    run = tmp_path_factory.mktemp(request.param) / "run"
    proc = run_cli(
        ["pretrain", "--data-path", demo_prefix, "--run-dir", str(run), *TINY_MODEL,
         *LAYOUTS[request.param], "--train-iters", "4", "--save-interval", "2",
         "--save", str(run / "checkpoints"), "--eval-interval", "2",
         "--log-diagnostics-interval", "2"],
        nproc=2,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return request.param, run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_analyze_equals_live_diagnostics(layout_run):
    name, run = layout_run
    proc = run_cli(["analyze", str(run), "--no-progress", "--no-init"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.load(open(run / "analysis" / "analysis.json"))
    (res,) = doc["runs"]
    assert res["iterations"] == [2, 4]
    live = read_diagnostics(run)
    checked = 0
    for key, series in res["metrics"].items():
        if key.startswith(("stable_rank/", "top_share/", "sink_share/", "norm_")):
            for it, value in zip(res["iterations"], series, strict=True):
                assert key in live[it], key
                assert close(value, live[it][key]), (key, it, value, live[it][key])
                checked += 1
    assert checked > 100
    if name == "moe-ep2":
        rec = live[4]
        for layer in (0, 1):
            experts = [rec[f"stable_rank/expert_fc2/layer_{layer:02d}/expert_{e:02d}"] for e in
                       range(4)]  # fmt: skip
            assert rec[f"stable_rank/expert_fc2/layer_{layer:02d}"] == pytest.approx(
                sum(experts) / 4, rel=1e-12
            )
            for metric in ("stable_rank", "condensation"):
                assert f"{metric}/router/layer_{layer:02d}" in rec
                assert f"{metric}/expert_fc1.up/layer_{layer:02d}/expert_03" in res["metrics"]
    else:
        layers = {key.split("/")[2] for key in live[4] if key.startswith("stable_rank/fc2/")}
        assert layers == {f"layer_{i:02d}" for i in range(4)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_checkpoints_of_the_layout(layout_run, demo_prefix, tmp_path):
    _, run = layout_run
    ckpts = run / "checkpoints"
    args = ["--data-path", demo_prefix, "--num-sequences", "8", "--no-progress"]
    a, b = str(ckpts / "iter_0000004"), str(ckpts / "iter_0000002")
    proc = run_cli(["compare", a, b, *args, "--output-dir", str(tmp_path / "ab")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.load(open(tmp_path / "ab" / "compare.json"))
    assert summary["tokens"] == 8 * 64
    assert np.isfinite(summary["a"]["mean_loss"]) and np.isfinite(summary["b"]["mean_loss"])
    assert summary["a"]["mean_loss"] != summary["b"]["mean_loss"]
    proc = run_cli(["compare", a, str(run), *args, "--output-dir", str(tmp_path / "aa")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"compare: warning: CKPT_A and CKPT_B are the same checkpoint ({a}): every" in (
        proc.stderr
    )  # the run directory resolves to its newest checkpoint, A itself
    same = np.load(tmp_path / "aa" / "tokens.npz")
    assert np.all(same["delta_sym"] == 0)

"""Megatron-LM's logging, W&B and profiling flags: what each adds or removes, read back from
metrics.jsonl, TensorBoard's EventAccumulator, W&B's offline run files and the trace files.

References: the params norm of a layout equals the fp64 norm of the single-rank model's global
tensors (the gamma-init is layout-independent bit for bit); the defaults' tags are checked in
test_pretrain.check_telemetry.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import os

import pytest
from distributed import run_distributed
from helpers import HAVE_WANDB, pretrain

from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.training.telemetry import check_telemetry

DENSE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=256)


def _norms() -> dict:
    """Params norm of the same model under TP2, PP2 (tied embeddings: the last stage's output
    copy must not count twice) and DP2, and the fp64 norm of the global tensors."""
    import torch
    from workers.common import build, gather_global, make_config

    from megatron_gamma.training.params_norm import params_l2_norm

    out = {}
    layouts = {
        "tp2": (DENSE, {"tensor_model_parallel_size": 2}),
        "pp2-tied": (
            dict(DENSE, untie_embeddings_and_output_weights=False),
            {"pipeline_model_parallel_size": 2},
        ),
        "dp2": (DENSE, {}),
        "dp2-tied": (dict(DENSE, untie_embeddings_and_output_weights=False), {}),
    }
    for name, (model, par) in layouts.items():
        models, _ = build(make_config(model, par))
        out[name] = params_l2_norm(models)
        if name == "dp2":
            glob_ = gather_global(models)
            out["fp64"] = math.sqrt(sum(float((t.double() ** 2).sum()) for t in glob_.values()))
    out["rank"] = torch.distributed.get_rank()
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_params_norm_counts_every_shard_once():
    ranks = run_distributed(_norms, 2)
    r = ranks[0]
    assert r["fp64"] > 1.0
    assert r["dp2"] == pytest.approx(r["fp64"], rel=1e-12)
    assert r["tp2"] == pytest.approx(r["fp64"], rel=1e-12)
    assert r["pp2-tied"] == pytest.approx(r["dp2-tied"], rel=1e-12)
    assert r["dp2-tied"] < r["dp2"]  # one V x h matrix fewer
    assert ranks[1]["tp2"] == r["tp2"] and ranks[1]["pp2-tied"] == r["pp2-tied"]


def test_machine_checks_name_the_fix(monkeypatch):
    cfg = load_config(None, {"profile": True})
    if not __import__("torch").cuda.is_available():
        with pytest.raises(ConfigError, match="profile=True: .*Fix: add --use-pytorch-profiler"):
            check_telemetry(cfg)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name)
    )
    with pytest.raises(
        ConfigError,
        match=r"wandb_project='p': .*pip install --no-build-isolation -e \"\.\[wandb\]\"",
    ):
        check_telemetry(load_config(None, {"wandb_project": "p"}))
    with pytest.raises(ConfigError, match="profile_step_end=3: the window"):
        load_config(None, {"profile_step_start": 3, "profile_step_end": 3})
    assert load_config(None, {"profile_ranks": ["0", "2"]}).logging.profile_ranks == [0, 2]


def _pretrain_with_wandb_failing_on_rank_0(run_dir: str, blocked: str) -> str:
    """Pretrain on this rank with a --wandb-save-dir that is a file, so that W&B cannot start
    (on rank 0, the only one that starts it); the error this rank stops with."""
    from megatron_gamma.training.loop import pretrain as train

    os.environ["WANDB_MODE"] = "offline"
    cfg = load_config(None, dict(
        DENSE, mock_data=True, train_iters=2, micro_batch_size=1, global_batch_size=2,
        run_dir=run_dir, wandb_project="p", wandb_save_dir=blocked, distributed_timeout_minutes=2,
    ))  # fmt: skip
    try:
        train(cfg)
    except ConfigError as e:
        return str(e)
    return "trained"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_WANDB, reason="wandb is not installed")
def test_wandb_failing_on_rank_0_stops_every_rank(tmp_path):
    """W&B starts on rank 0 and the outcome is broadcast: rank 1 stops with rank 0's error
    instead of waiting at the next collective."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    errors = run_distributed(
        _pretrain_with_wandb_failing_on_rank_0, 2, str(tmp_path / "run"), str(blocked), timeout=240
    )
    assert errors[0] == errors[1], errors
    assert errors[0].startswith("wandb_project='p': Weights & Biases did not start on rank 0")
    assert str(blocked) in errors[0] and "Fix: " in errors[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_logging_flags_change_what_is_written(tmp_path, demo_prefix, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = ["--train-iters", "4", "--eval-interval", "2", "--log-interval", "2"]
    flags += ["--tensorboard-log-interval", "2", "--log-params-norm", "--log-num-zeros-in-grad"]
    flags += ["--no-log-throughput", "--no-log-memory-to-tensorboard"]
    flags += ["--no-log-validation-ppl-to-tensorboard"]
    flags += ["--profile", "--use-pytorch-profiler"]
    flags += ["--profile-step-start", "1", "--profile-step-end", "3"]
    if HAVE_WANDB:
        monkeypatch.setenv("WANDB_MODE", "offline")
        flags += ["--wandb-project", "megatron-gamma-test", "--wandb-exp-name", "flags"]
    run = tmp_path / "run"
    pretrain(run, demo_prefix, *flags)
    with open(run / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4]  # jsonl keeps every iteration
    for row in train:
        assert row["params_norm"] > 0 and row["num_zeros_in_grad"] >= 0
        assert not {"tokens_per_s", "mem_rss_gib"} & set(row)
    valid = [r for r in rows if r["split"] == "valid"]
    assert valid and all(r["ppl"] == pytest.approx(math.exp(r["loss"])) for r in valid)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/params_norm", "train/num_zeros_in_grad", "valid/loss"} <= tags
    assert not [t for t in tags if t.startswith("throughput/") or "mem" in t]
    assert "valid/ppl" not in tags
    norms = acc.Scalars("train/params_norm")
    assert [e.step for e in norms] == [2, 4]
    assert [e.value for e in norms] == pytest.approx(
        [train[1]["params_norm"], train[3]["params_norm"]]
    )
    traces = glob.glob(str(run / "tensorboard" / "*.pt.trace.json"))
    assert [os.path.basename(t).split(".")[0] for t in traces] == ["rank0"]
    with open(traces[0]) as f:
        assert json.load(f)["traceEvents"]
    if HAVE_WANDB:
        runs = glob.glob(str(run / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
        assert len(runs) == 1 and os.path.getsize(runs[0]) > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_only_the_profile_ranks_write_traces(tmp_path, demo_prefix):
    flags = ["--train-iters", "3", "--eval-interval", "100", "--global-batch-size", "8"]
    flags += ["--profile", "--use-pytorch-profiler", "--profile-ranks", "1"]
    flags += ["--profile-step-start", "0", "--profile-step-end", "2"]
    pretrain(tmp_path, demo_prefix, *flags, nproc=2)
    traces = glob.glob(str(tmp_path / "tensorboard" / "*.pt.trace.json"))
    assert [os.path.basename(t).split(".")[0] for t in traces] == ["rank1"]

"""``evaluate RUN`` on a ``--data-path P --split 95,5,0`` run (no per-split paths): the run's own
validation split, scored as pretrain's validation scored it.

The reference is the trainer's own path: the validation loss pretrain logged in
``metrics.jsonl`` at the iteration of each checkpoint. Both are fp32 on the CPU over the same
weights and samples; they differ only in the order of the fp32 sums (pretrain sums a
micro-batch's 4 x 64 token losses at once, evaluate per sample then in float64), a relative
error of order 256 x 2^-24 ~ 1.5e-5 at worst and 1e-7 or so in practice (measured: 2e-8).
``TOL`` = 2e-6 nats (relative 2.4e-7 at a loss of 8.3) lies well within that bound's worst case
yet far below what other samples give (the two checkpoints' losses, and the first windows of the
same prefix, are asserted to lie more than 100 x ``TOL`` away). Near initialization every token's
loss is close to ln(vocab), so the mean of micro-batch means and the token-weighted mean of these
samples differ by about ``TOL`` only: :func:`test_split_loss_averages_micro_batch_means` pins
that rule by hand instead.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from helpers import pretrain, read_metrics, run_cli

from megatron_gamma.cli import main
from megatron_gamma.config import ConfigError
from megatron_gamma.diagnostics.compare import score_tokens, token_windows
from megatron_gamma.evaluation.evaluate import evaluate, split_loss
from megatron_gamma.rundir import checkpoint, loader

TOL = 2e-6
EVAL_ITERS, GLOBAL_BATCH, SEQ = 4, 8, 64
RUN_FLAGS = [
    "--train-iters", "3", "--eval-interval", "2", "--save-interval", "2",
    "--eval-iters", str(EVAL_ITERS), "--log-diagnostics-interval", "0",
    "--eod-mask-loss", "--reset-attention-mask",
]  # fmt: skip
"""Validation and a checkpoint at iterations 2 and 3; 32 validation samples of 64 tokens (the
demo's documents average ~750 tokens, so some samples hold an EOD that ``--eod-mask-loss``
masks, and ``--reset-attention-mask`` gives those samples their own attention masks)."""


@pytest.fixture(scope="module")
def split_run(tmp_path_factory, demo_prefix) -> str:
    """A 3-iteration tiny run on the demo with ``--split 95,5,0`` (helpers.TINY_MODEL)."""
    run = tmp_path_factory.mktemp("eval_split") / "run"
    pretrain(run, demo_prefix, *RUN_FLAGS, "--save", str(run / "checkpoints"))
    return str(run)


def _ckpt(run: str, iteration: int) -> str:
    return os.path.join(run, "checkpoints", f"iter_{iteration:07d}")


def _rewritten_config(run: str, path, **data) -> str:
    """The run's config.yaml with ``data`` (section ``data``) or ``eval_iters`` replaced."""
    with open(os.path.join(run, "config.yaml")) as f:
        raw = yaml.safe_load(f)
    if "eval_iters" in data:
        raw["training"]["eval_iters"] = data.pop("eval_iters")
    raw["data"].update(data)
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.slow
def test_evaluate_equals_the_validation_loss_pretrain_logged(split_run, demo_prefix):
    logged = read_metrics(split_run)["valid"]
    assert sorted(logged) == [2, 3]
    for iteration in (2, 3):
        out = evaluate(_ckpt(split_run, iteration))
        assert out["iteration"] == iteration and out["source"] == "split"
        assert out["loss"] == pytest.approx(logged[iteration], abs=TOL), iteration
        assert out["windows"] == EVAL_ITERS * GLOBAL_BATCH and out["seq_length"] == SEQ
        assert out["tokens"] < out["windows"] * SEQ  # the EOD mask bit
        [data] = out["data"]
        assert data["prefix"] == demo_prefix and data["windows"] == out["windows"]
        assert out["scored"] == (
            f"the run's validation split (data_path {demo_prefix}, split 95,5,0): "
            f"eval_iters x global_batch_size = {EVAL_ITERS} x {GLOBAL_BATCH} = "
            f"{EVAL_ITERS * GLOBAL_BATCH} samples of {SEQ} tokens"
        )
    assert logged[2] != pytest.approx(logged[3], abs=100 * TOL)  # the two checkpoints differ


@pytest.mark.slow
def test_cli_prints_and_writes_what_it_scored(split_run, tmp_path):
    proc = run_cli(
        ["evaluate", split_run, "--micro-batch-size", "3", "--output-dir", str(tmp_path / "eval")]
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((tmp_path / "eval" / "eval_loss.json").read_text())
    # another forward batch size (3 does not divide a micro-batch of 4), the same loss
    assert out["loss"] == pytest.approx(read_metrics(split_run)["valid"][3], abs=TOL)
    assert f"(iteration 3): loss {out['loss']:.6f}" in proc.stdout
    assert f"on {out['tokens']} tokens of {out['scored']}\n" in proc.stdout


@pytest.mark.slow
def test_two_processes_score_the_split_as_one(split_run, tmp_path):
    """Under torchrun every process builds the split in its own scratch directory (not one
    that only rank 0 wrote) and the per-sample sums are all-reduced: the loss of one process."""
    one = evaluate(_ckpt(split_run, 2))
    proc = run_cli(
        ["evaluate", _ckpt(split_run, 2), "--output-dir", str(tmp_path / "eval")], nproc=2
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = json.loads((tmp_path / "eval" / "eval_loss.json").read_text())
    assert two["processes"] == 2 and two["tokens"] == one["tokens"]
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-12)


def _files(folder) -> dict[str, int]:
    """{path relative to ``folder``: modification time in ns} of every file below it."""
    return {
        os.path.relpath(os.path.join(root, name), folder): os.stat(
            os.path.join(root, name)
        ).st_mtime_ns
        for root, _, names in os.walk(folder)
        for name in names
    }


@pytest.mark.slow
def test_a_data_cache_path_reuses_pretrains_caches_and_keeps_its_own(split_run, tmp_path):
    """--data-cache-path RUN/data_cache reads the caches pretrain built there (no file written
    or rewritten); a new directory gets the same caches, built once and read by the next call;
    the loss is pretrain's logged validation loss either way."""
    logged = read_metrics(split_run)["valid"][3]
    pretrains = os.path.join(split_run, "data_cache")
    before = _files(pretrains)
    assert before  # pretrain's default cache directory holds its index caches
    assert evaluate(split_run, data_cache_path=pretrains)["loss"] == pytest.approx(logged, abs=TOL)
    assert _files(pretrains) == before
    own = tmp_path / "cache"
    first = evaluate(split_run, data_cache_path=str(own))["loss"]
    built = _files(own)
    assert sorted(built) == sorted(before)
    again = evaluate(split_run, data_cache_path=str(own))["loss"]
    assert _files(own) == built and first == again == pytest.approx(logged, abs=TOL)


@pytest.mark.slow
def test_two_processes_share_a_data_cache_path(split_run, tmp_path):
    """Under torchrun rank 0 builds a shared --data-cache-path's caches and the other reads
    them: the loss of one process; off the run's split the flag is refused by name."""
    one = evaluate(_ckpt(split_run, 2))
    cache = tmp_path / "cache"
    flags = ["--data-cache-path", str(cache), "--output-dir", str(tmp_path / "out")]
    proc = run_cli(["evaluate", _ckpt(split_run, 2), *flags], nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = json.loads((tmp_path / "out" / "eval_loss.json").read_text())
    assert two["processes"] == 2 and two["loss"] == pytest.approx(one["loss"], abs=1e-12)
    assert sorted(_files(cache)) == sorted(_files(os.path.join(split_run, "data_cache")))
    with pytest.raises(ConfigError) as e:
        evaluate(split_run, [os.path.join(split_run, "data", "x")], data_cache_path=str(cache))
    assert str(e.value) == (
        f"data_cache_path={str(cache)!r}: acts only on the run's own validation split; windows "
        "of --data-path are read straight from the dataset, with no index cache. Fix: drop "
        "--data-cache-path"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"]
)
def test_a_model_parallel_runs_split_scores_its_logged_loss(tmp_path, demo_prefix, layout):
    """A run trained on 2 processes with TP = 2 (or PP = 2) validated with its sums split
    across them; evaluate reshards its checkpoint onto one process and scores the same samples:
    pretrain's logged loss up to the order of the sums (measured: 3.0e-7 and 8.9e-8 nats, TP)."""
    run = tmp_path / "run"
    flags = [*RUN_FLAGS, layout, "2", "--save", str(run / "checkpoints")]
    logged = pretrain(run, demo_prefix, *flags, nproc=2)["valid"]
    for iteration in (2, 3):
        out = evaluate(_ckpt(str(run), iteration))
        assert out["loss"] == pytest.approx(logged[iteration], abs=TOL), iteration


@pytest.mark.slow
def test_data_path_still_replaces_the_run_split(split_run, demo_prefix):
    out = evaluate(split_run, [demo_prefix], eval_tokens=4 * SEQ)
    assert out["source"] == "data_path" and out["tokens"] == 4 * SEQ and out["windows"] == 4
    assert out["scored"] == f"data_path {demo_prefix}: 4 windows of {SEQ} tokens"
    run = checkpoint.resolve(split_run)
    with loader.single_process(run.cfg):
        model, _ = checkpoint.load_model(run)
        nll = -score_tokens(model, token_windows(demo_prefix, 4, SEQ), 4).double()
    assert out["loss"] == pytest.approx(float(nll.mean()), abs=1e-6)
    assert abs(out["loss"] - read_metrics(split_run)["valid"][3]) > 100 * TOL


@pytest.mark.slow
def test_valid_data_path_default_is_unchanged(split_run, demo_prefix, tmp_path):
    config = _rewritten_config(
        split_run,
        tmp_path / "config.yaml",
        data_path=[],
        train_data_path=[demo_prefix],
        valid_data_path=[demo_prefix],
    )
    out = evaluate(split_run, config=config, eval_tokens=4 * SEQ)
    assert out["source"] == "valid_data_path" and out["tokens"] == 4 * SEQ
    assert out["scored"] == f"the run's valid_data_path {demo_prefix}: 4 windows of {SEQ} tokens"
    assert out["loss"] == evaluate(split_run, [demo_prefix], eval_tokens=4 * SEQ)["loss"]


@pytest.mark.slow
def test_a_split_without_validation_is_refused(tmp_path, demo_prefix, capsys):
    run = tmp_path / "no_valid"
    flags = ["--train-iters", "1", "--split", "100,0,0", "--eval-iters", "0"]
    pretrain(run, demo_prefix, *flags, "--save", str(run / "checkpoints"))
    with pytest.raises(ConfigError) as e:
        evaluate(str(run))
    assert str(e.value) == (
        f"split='100,0,0': the run's validation split has weight 0 (data_path {demo_prefix}, "
        "split 100,0,0), so pretrain validated on nothing and there is no validation split to "
        "score. Fix: pass --data-path PREFIX (or a blend W1 P1 W2 P2 ...) of held-out data"
    )
    assert main(["evaluate", str(run)]) == 2
    assert "split='100,0,0': the run's validation split has weight 0" in capsys.readouterr().err
    out = evaluate(str(run), [demo_prefix], eval_tokens=2 * SEQ)
    assert out["source"] == "data_path" and out["tokens"] == 2 * SEQ


@pytest.mark.slow
def test_flags_that_choose_other_samples_are_refused(split_run, tmp_path, capsys):
    for flag, name in (("--eval-tokens", "eval_tokens"), ("--seq-length", "seq_length")):
        assert main(["evaluate", split_run, flag, "32"]) == 2
        err = capsys.readouterr().err
        assert f"{name}=32: the run's validation split (data_path " in err
        assert f"= {EVAL_ITERS * GLOBAL_BATCH} samples of seq_length {SEQ}; {name} would" in err
        assert f"Fix: drop {flag}, or pass --data-path PREFIX" in err
    config = _rewritten_config(split_run, tmp_path / "config.yaml", eval_iters=0)
    with pytest.raises(ConfigError, match=r"^eval_iters=0: the run turned validation off "):
        evaluate(split_run, config=config)


@pytest.mark.slow
def test_a_config_without_the_checkpoints_gates_is_refused(split_run, demo_prefix, tmp_path):
    """evaluate --config of the same model without gated attention read the gated checkpoint
    without its gate weights and printed that other model's loss as the checkpoint's (a new
    user's trial 3). A read of the weights alone now refuses weights the model does not take,
    naming them and the fix."""
    with open(os.path.join(split_run, "config.yaml")) as f:
        raw = yaml.safe_load(f)
    assert raw["model"]["gated_attention"] == "elementwise"
    raw["model"]["gated_attention"] = "none"
    config = tmp_path / "ungated.yaml"
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        evaluate(split_run, [demo_prefix], config=str(config), eval_tokens=4 * SEQ)
    assert str(e.value) == (
        f"{_ckpt(split_run, 3)} holds weights the model built from this config does not take "
        "(2: decoder.layers.self_attention.linear_gate._extra_state, "
        "decoder.layers.self_attention.linear_gate.weight): without them it is another model "
        "than the checkpoint's. Fix: pass the config.yaml of the run that wrote the checkpoint "
        "(drop --config: the checkpoint carries its own)"
    )


def test_split_loss_averages_micro_batch_means():
    """Pretrain's rule: each micro-batch's summed loss over its loss-mask count, then the mean
    of those; neither the token-weighted mean nor the mean of per-sample means."""
    nll = [6.0, 2.0, 1.0, 3.0]  # summed nats per sample
    count = [3.0, 2.0, 2.0, 6.0]  # loss-mask tokens per sample
    per_sample = torch.tensor([nll, count, [0.0] * 4], dtype=torch.float64)
    # micro-batches of 2: (6 + 2) / (3 + 2) = 1.6 and (1 + 3) / (2 + 6) = 0.5
    assert split_loss(per_sample, 2) == pytest.approx((1.6 + 0.5) / 2, abs=1e-15)
    assert split_loss(per_sample, 4) == pytest.approx(12.0 / 13.0, abs=1e-15)  # token-weighted
    assert split_loss(per_sample, 1) == pytest.approx((2.0 + 1.0 + 0.5 + 0.5) / 4, abs=1e-15)

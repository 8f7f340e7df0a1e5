"""Checkpoint operations for long runs: weights-only starts (``--finetune``,
``--pretrained-checkpoint``), ``--no-load-optim`` / ``--no-load-rng`` / ``--no-save-optim``,
retention (``--save-retain-last`` / ``--save-retain-interval``) and ``--async-save``.

References: the source checkpoint's weights read independently through
:mod:`megatron_gamma.rundir.checkpoint` (single process, fp32), the progress counters the
source run saved, a freshly seeded trainer's RNG, and the closed-form retention rule.
(SIGTERM: tests/test_launch_preemption.py; starting from an ``import-hf`` checkpoint:
tests/test_evaluation.py.)
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil

import pytest
import torch
from distributed import run_distributed
from helpers import pretrain

from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.rundir import checkpoint, loader
from megatron_gamma.training.checkpointing import (
    checkpoint_dir,
    latest_iteration,
    missing_load_warning,
    retained,
)
from megatron_gamma.training.loop import preflight

SOURCE_ITERS = 6
QUIET = ["--eval-interval", "100", "--log-diagnostics-interval", "0"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, demo_prefix) -> str:
    """A tiny run of 6 iterations that saved after every iteration (run directory); its hidden
    dropout draws from the torch RNG, so the saved RNG state differs from a freshly seeded one."""
    run = tmp_path_factory.mktemp("ckptops") / "source"
    pretrain(run, demo_prefix, "--train-iters", str(SOURCE_ITERS), "--save-interval", "1",
             "--hidden-dropout", "0.1", "--save", str(run / "checkpoints"), *QUIET)  # fmt: skip
    return str(run)


def _optimizer_state(optimizer) -> tuple[int, float]:
    """(parameters with Adam state, sum of |exp_avg|) over megatron-core's inner optimizers."""
    count, total = 0, 0.0
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in inner.optimizer.state.values():
            count += 1
            total += float(state["exp_avg"].abs().sum())
    return count, total


def _start_states(config_path: str, starts: dict[str, dict]) -> dict[str, dict]:
    """Build a Trainer for each {name: config overrides} in turn (one process) and report what
    it starts from: weights, progress, schedule step, optimizer state and RNG. A start given
    ``save`` also writes a checkpoint from there."""
    from megatron_gamma.training.loop import Trainer

    out = {}
    for name, overrides in starts.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            trainer = Trainer(load_config(config_path, overrides))
        try:
            model = trainer.chunks[0].module
            out[name] = {
                "audit": next(
                    x for x in printed.getvalue().splitlines() if x.startswith("init audit")
                ),
                "weights": {
                    k: v.detach().clone()
                    for k, v in model.state_dict().items()
                    if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
                },
                "iteration": trainer.state.iteration,
                "consumed_samples": trainer.state.consumed_samples,
                "scheduler_steps": trainer.scheduler.num_steps,
                "optimizer": _optimizer_state(trainer.optimizer),
                "rng": torch.get_rng_state().clone(),
            }
            if overrides.get("save"):
                trainer.save()
        finally:
            trainer.close()
    return out


def _reference_weights(ckpt: str) -> dict[str, torch.Tensor]:
    rc = checkpoint.resolve(ckpt)
    with loader.single_process(rc.cfg):
        model, _ = checkpoint.load_model(rc)
        return {
            k: v.clone()
            for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
        }


def _assert_same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_weights_only_and_partial_loads_start_where_promised(source, tmp_path):
    root = os.path.join(source, "checkpoints")
    config = os.path.join(source, "config.yaml")
    no_optim = str(tmp_path / "no_optim")
    starts = {  # each in a run directory of its own: one that saved holds that run's records
        "fresh": {"load": None},
        "resume": {"load": root},
        "no_save_optim": {"load": root, "save": no_optim, "save_optim": False},
        "finetune": {"load": root, "finetune": True},
        "pretrained": {"load": str(tmp_path / "empty"), "pretrained_checkpoint": root},
        "no_load_optim": {"load": no_optim, "load_optim": False},
        "no_load_rng": {"load": root, "load_rng": False},
    }
    starts = {k: {"run_dir": str(tmp_path / k), "save": None, **v} for k, v in starts.items()}
    (got,) = run_distributed(_start_states, 1, config, starts)
    want = _reference_weights(checkpoint_dir(root, SOURCE_ITERS))
    samples = SOURCE_ITERS * 8  # global batch size 8

    # the init audit measures the config's initialization and says when a checkpoint replaces it
    assert "replace" not in got["fresh"]["audit"]
    for name in ("finetune", "pretrained"):
        replaced = f"the weights of {root}, loaded next, replace this initialization"
        assert replaced in got[name]["audit"], name
    # a resume measures nothing: the run's own audit describes the weights' start
    assert got["resume"]["audit"].startswith(
        f"init audit: not measured on a resume (the weights of {root} replace"
    )

    # a full resume restores everything: the reference for what the partial loads keep
    resume = got["resume"]
    _assert_same_weights(resume["weights"], want)
    assert (resume["iteration"], resume["consumed_samples"]) == (SOURCE_ITERS, samples)
    assert resume["scheduler_steps"] == samples  # the schedule counts samples
    assert resume["optimizer"][0] > 0 and resume["optimizer"][1] > 0
    assert not torch.equal(resume["rng"], got["fresh"]["rng"])
    fresh_optimizer = got["fresh"]["optimizer"]
    assert fresh_optimizer == (0, 0.0)

    for name in ("finetune", "pretrained"):  # weights only: iteration 0, fresh everything
        start = got[name]
        _assert_same_weights(start["weights"], want)
        assert (start["iteration"], start["consumed_samples"], start["scheduler_steps"]) == (
            0, 0, 0,
        )  # fmt: skip
        assert start["optimizer"] == fresh_optimizer
        assert torch.equal(start["rng"], got["fresh"]["rng"])

    # --no-save-optim wrote iteration 6 without optimizer state: --no-load-optim resumes from it
    assert latest_iteration(no_optim) == SOURCE_ITERS
    start = got["no_load_optim"]
    _assert_same_weights(start["weights"], want)
    assert (start["iteration"], start["consumed_samples"]) == (SOURCE_ITERS, samples)
    assert start["scheduler_steps"] == samples  # the schedule counts samples
    assert start["optimizer"] == fresh_optimizer
    assert torch.equal(start["rng"], resume["rng"])

    start = got["no_load_rng"]
    assert torch.equal(start["rng"], got["fresh"]["rng"])
    assert start["optimizer"] == resume["optimizer"] and start["iteration"] == SOURCE_ITERS

    # ... and a full resume from it is refused before anything is built, naming the fix
    with pytest.raises(ConfigError, match="--no-save-optim.*Fix: add --no-load-optim"):
        preflight(load_config(config, {"load": no_optim}))


def test_load_errors_name_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="finetune=True: needs load"):
        load_config(None, {"finetune": True})
    with pytest.raises(ConfigError, match=r"pretrained_checkpoint=.*holds no complete checkpoint"):
        preflight(load_config(None, {"pretrained_checkpoint": str(tmp_path)}))
    with pytest.raises(ConfigError, match=r"load=.*holds no complete checkpoint"):
        preflight(load_config(None, {"load": str(tmp_path), "finetune": True}))
    with pytest.raises(ConfigError, match="async_save=True: .*needs CUDA.*Fix: drop --async-save"):
        load_config(None, {"async_save": True})
    with pytest.raises(ConfigError, match="save_retain_last=0: must be >= 1"):
        load_config(None, {"save_retain_last": 0})


def test_missing_load_path_warns_unless_it_is_also_save(tmp_path, capsys):
    missing = str(tmp_path / "typo" / "ckpt")
    common = {"mock_data": True, "run_dir": str(tmp_path / "run")}
    warning = (
        f"WARNING: load='{missing}': does not exist, so there is no checkpoint to resume and "
        "training starts from scratch. Fix: if the path is a typo"
    )
    preflight(load_config(None, {**common, "load": missing}))
    assert warning in capsys.readouterr().out
    # with --pretrained-checkpoint a fresh start takes its weights: the warning says so
    assert "starts from the weights of --pretrained-checkpoint /p at iteration 0." in (
        missing_load_warning(missing, None, "/p")
    )
    # the first run of --load S --save S (automatic resume) and an existing empty --load: silent
    preflight(load_config(None, {**common, "load": missing, "save": missing}))
    preflight(load_config(None, {**common, "load": str(tmp_path)}))
    assert "WARNING: load=" not in capsys.readouterr().out
    assert not os.path.exists(missing) and not os.path.exists(common["run_dir"])


@pytest.mark.parametrize("name", ["config.yaml", "latest_checkpointed_iteration.txt"])
def test_a_load_path_that_is_a_file_is_refused_before_anything_is_written(tmp_path, name):
    """--load given a file (the config, the tracker) trained from scratch without a word."""
    afile = tmp_path / name
    afile.write_text("2\n")
    run_dir = tmp_path / "run"
    cfg = load_config(None, {"mock_data": True, "run_dir": str(run_dir), "load": str(afile)})
    with pytest.raises(ConfigError) as e:
        preflight(cfg)
    assert str(e.value) == (
        f"load={str(afile)!r}: is a file, not a checkpoint directory. Fix: pass the --save "
        "directory of the run to resume (or drop --load)"
    )
    assert not os.path.exists(run_dir) and afile.read_text() == "2\n"


def test_retained_set_closed_form():
    iterations = list(range(1, 24))
    assert retained(iterations, None, None) == set(iterations)
    assert retained(iterations, 2, None) == {22, 23}
    assert retained(iterations, 3, 10) == {10, 20, 21, 22, 23}
    assert retained([5], 1, 10) == {5}


def _listing(root) -> list[str]:
    return sorted(os.listdir(root))


def _iters(*its: int) -> list[str]:
    return [f"iter_{i:07d}" for i in its] + ["latest_checkpointed_iteration.txt"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_retention_keeps_exactly_the_promised_set_after_a_crash(source, demo_prefix, tmp_path):
    # The source run saved iterations 1..6 and kept them all: the state a run with retention
    # leaves when it crashes after each save and before its deletions. One deletion was also cut
    # short after its rename (iter_3.deleting), and one later save never completed
    # (iter_5.partial, older than the newest checkpoint).
    root = tmp_path / "checkpoints"
    shutil.copytree(os.path.join(source, "checkpoints"), root)
    os.replace(root / "iter_0000003", root / "iter_0000003.deleting")
    shutil.copytree(root / "iter_0000002", root / "iter_0000005.partial")
    assert latest_iteration(str(root)) == SOURCE_ITERS  # nothing promised was lost
    flags = ["--train-iters", "9", "--save-interval", "1", "--save-retain-last", "2",
             "--save-retain-interval", "4", "--load", str(root), "--save", str(root),
             "--override-opt-param-scheduler", *QUIET]  # fmt: skip
    # the first save of the resumed run (iteration 7) thins the leftovers to the promise
    pretrain(tmp_path / "a", demo_prefix, *flags, "--exit-interval", "7")
    assert _listing(root) == _iters(4, 6, 7)
    resumed = pretrain(tmp_path / "b", demo_prefix, *flags)
    assert sorted(resumed["train"]) == [8, 9]
    assert _listing(root) == _iters(4, 8, 9)
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "9"


def test_a_resume_from_import_hf_weights_names_the_directory_in_its_fix(tmp_path):
    """A full resume (--load) of an import-hf checkpoint, which holds model weights only, is
    refused with the two ways to start from it; trial 16: the fix said --pretrained-checkpoint
    DIR, a placeholder, for a directory the message knows. Now the directory, as a shell word
    (a path with a space quoted)."""
    from megatron_gamma.training.checkpointing import check_loadable

    root = tmp_path / "my imports" / "checkpoints"
    os.makedirs(checkpoint_dir(str(root), 0))
    with pytest.raises(ConfigError) as e:
        check_loadable(str(root), weights_only=False, load_optim=True, common={})
    fix = str(e.value).split("Fix: start from it with ", 1)[1]
    first, second = fix.split(", or ")
    assert shlex.split(first) == ["--pretrained-checkpoint", str(root)]
    assert shlex.split(second) == ["--finetune", "--load", str(root)]
    check_loadable(str(root), weights_only=True, load_optim=False, common={})  # the fix's load

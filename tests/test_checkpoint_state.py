"""Damaged or contested checkpoint and run directories: a torn tracker file is named with the fix;
a run without --load does not write into another run's checkpoints, nor take over another run's
directory, unless --overwrite; a second writer of the same --save or --run-dir is refused while
the first holds its lock."""

import fcntl
import os
import re

import pytest
import yaml
from helpers import HAVE_WANDB, OVERFLOW, TINY_MODEL, read_metrics, run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.rundir import layout
from megatron_gamma.training import checkpointing
from megatron_gamma.training.checkpointing import TRACKER, latest_iteration


def test_a_held_lock_is_refused_and_an_unlockable_file_system_warned_about(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    handle, refused = checkpointing._exclusive("run_dir", str(run), ".run.lock", "busy", "wait")
    assert refused is None and handle is not None
    with open(run / ".run.lock") as other:  # a second open file description: its own flock
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    again, refused = checkpointing._exclusive("run_dir", str(run), ".run.lock", "busy", "wait")
    assert again is None and refused.startswith(f"run_dir={str(run)!r}: busy (")
    assert refused.endswith("). Fix: wait")
    checkpointing.release_lock(handle)

    def no_flock(path):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(checkpointing, "_lock", no_flock)
    assert checkpointing._exclusive("save", str(tmp_path / "s"), ".lock", "busy", "wait") == (
        None,
        None,
    )
    assert "WARNING: save=" in capsys.readouterr().out
    assert (tmp_path / "s").is_dir()


@pytest.mark.parametrize("where", ["is a file", "under a file"])
def test_a_run_or_save_directory_that_cannot_be_one_is_refused_by_name(tmp_path, where):
    """--run-dir (or --save) naming an existing file, or a path under one, ended pretrain with a
    FileExistsError / NotADirectoryError traceback; it is refused on every rank with the fix,
    and the file is left as it was."""
    from megatron_gamma.config import ConfigError, load_config
    from megatron_gamma.rundir import loader

    (tmp_path / "config.yaml").write_text("model: {}\n")
    run = tmp_path / "config.yaml" if where == "is a file" else tmp_path / "config.yaml" / "run"
    there = "exists and is not a directory" if where == "is a file" else "cannot be made"
    with loader.single_process(load_config(None)):
        with pytest.raises(ConfigError) as e:
            checkpointing.claim_run_dir(str(run), None, overwrite=False)
        with pytest.raises(CheckpointError) as saved:
            checkpointing.claim_save_dir(str(run), False)
    for key, error in (("run_dir", e), ("save", saved)):
        assert str(error.value).startswith(f"{key}={str(run)!r}: {there} (")
        assert str(error.value).endswith(
            "). Fix: pass a directory path, a new one or an existing directory"
        )
    assert (tmp_path / "config.yaml").read_text() == "model: {}\n"


def _link_refusal(link, target) -> str:
    return (
        f"{link}: a symbolic link (to {str(target)!r}); this file is written in place, so the "
        "write would land where the link points. Fix: remove the link (a directory copied from "
        "elsewhere may hold it) and rerun"
    )


@pytest.mark.parametrize("key, lock", [("run_dir", ".run.lock"), ("save", ".lock")])
def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_untouched(
    tmp_path, key, lock
):
    """A run directory or checkpoint root from elsewhere may hold its lock file as a link: taking
    the lock (truncate, write the pid) would overwrite the file it points to (``~/.bashrc``), or
    create one where it dangles."""
    victim = tmp_path / "bashrc"
    victim.write_text("export IMPORTANT=1\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / lock).symlink_to(victim)
    handle, refused = checkpointing._exclusive(key, str(run), lock, "busy", "wait")
    assert handle is None
    assert refused == f"{key}={str(run)!r}: {_link_refusal(run / lock, victim)}"
    assert victim.read_text() == "export IMPORTANT=1\n"
    (run / lock).unlink()
    (run / lock).symlink_to(tmp_path / "elsewhere")  # dangling
    handle, refused = checkpointing._exclusive(key, str(run), lock, "busy", "wait")
    assert handle is None
    assert refused == f"{key}={str(run)!r}: {_link_refusal(run / lock, tmp_path / 'elsewhere')}"
    assert not os.path.lexists(tmp_path / "elsewhere")


def test_a_metrics_file_that_is_a_symbolic_link_is_refused_before_anything_is_written(tmp_path):
    """``metrics.jsonl`` is appended to in place: a link in the run directory is refused when the
    run claims it (every rank stops together), and by the logger itself."""
    from megatron_gamma.atomic import LinkedFileError
    from megatron_gamma.config import ConfigError, load_config
    from megatron_gamma.rundir import loader
    from megatron_gamma.training.metrics import MetricsLogger

    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "elsewhere.pth"
    (run / layout.METRICS).symlink_to(target)
    with loader.single_process(load_config(None)):
        with pytest.raises(ConfigError) as e:
            checkpointing.claim_run_dir(str(run), None, overwrite=True)
    assert str(e.value) == f"run_dir={str(run)!r}: {_link_refusal(run / layout.METRICS, target)}"
    assert sorted(os.listdir(run)) == [layout.METRICS] and not os.path.lexists(target)
    with pytest.raises(LinkedFileError):
        MetricsLogger(str(run), str(tmp_path / "tb"), True, 1, 0, progress_bar=False)
    assert not os.path.lexists(target)


def test_the_run_dir_lock_still_refuses_a_takeover_the_command_line_did_not_see(tmp_path):
    """The command line refuses another run's directory before torch (``test_cli_imports``);
    a run started without it (``Trainer``), or a directory written into after that check,
    meets the same refusal under the run-directory lock, and a resume of that run or
    ``--overwrite`` takes the lock."""
    from megatron_gamma.config import ConfigError, load_config
    from megatron_gamma.rundir import loader

    run, save = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    (run / layout.CONFIG).write_text(f"checkpoint:\n  save: {save}\n")
    (run / layout.METRICS).write_text('{"iteration": 1}\n')
    with loader.single_process(load_config(None)):
        with pytest.raises(ConfigError) as e:
            checkpointing.claim_run_dir(str(run), None, overwrite=False)
        assert not os.path.exists(run / checkpointing.RUN_LOCK)  # released on the refusal
        for load, overwrite in ((str(save), False), (None, True)):
            handle, takeover = checkpointing.claim_run_dir(str(run), load, overwrite=overwrite)
            assert handle is not None and os.path.isfile(run / checkpointing.RUN_LOCK)
            assert takeover is None
            checkpointing.release_lock(handle)
    assert str(e.value).startswith(
        f"run_dir={str(run)!r}: holds the records of a run (config.yaml, metrics.jsonl) that "
        "this run does not continue (no --load);"
    )
    assert sorted(os.listdir(run)) == [layout.CONFIG, layout.METRICS]


DIAGNOSTICS_0 = '{"iteration": 0, "split": "diagnostics", "stable_rank/embedding": 3.5}\n'
"""The record a fresh run writes before its first step: the initialized model's diagnostics."""


@pytest.mark.parametrize(
    "metrics, checkpoints, records",
    [
        ("", {}, None),
        (DIAGNOSTICS_0 * 2, {}, None),
        (DIAGNOSTICS_0 + '{"iteration": 1, "split": "train", "loss": 9.0}\n', {}, "metrics.jsonl"),
        (DIAGNOSTICS_0 + '{"iteration": 1, "split": "tr', {}, "metrics.jsonl"),  # torn
        ('{"split": "train", "loss": 9.0}\n', {}, "metrics.jsonl"),  # no iteration
        (DIAGNOSTICS_0, {"save": 1}, "{save}/iter_0000001"),
        ("", {"own": 0}, "checkpoints/iter_0000000"),  # import-hf's weights
    ],
)
def test_a_run_directory_counts_as_another_run_only_with_a_checkpoint_or_an_iteration(
    tmp_path, metrics, checkpoints, records
):
    """A run that stopped at its first step (trial 14 #4) left config.yaml and a metrics.jsonl
    of iteration-0 records (the live diagnostics of its initialization), and its directory was
    refused to the rerun with "add --load SAVE to resume that run" although SAVE was empty. It
    is taken over, saying so; a checkpoint (in the ``save`` config.yaml records, or in
    ``RUN/checkpoints``) or an iteration in metrics.jsonl (or a line that cannot be read as one)
    still makes it another run's."""
    from megatron_gamma.config import ConfigError
    from megatron_gamma.rundir.paths import check_takeover

    run, save = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    save.mkdir()
    (run / "config.yaml").write_text(f"checkpoint:\n  save: {save}\n")
    (run / "metrics.jsonl").write_text(metrics)
    for where, iteration in checkpoints.items():
        root = save if where == "save" else run / "checkpoints"
        os.makedirs(layout.checkpoint_dir(str(root), iteration))
    before = sorted(os.listdir(run))
    if records is None:
        assert check_takeover(str(run), None) == (
            f"run_dir={str(run)!r}: held a run that never finished an iteration (config.yaml; "
            "no checkpoint, no iteration in metrics.jsonl); this run takes the directory over: "
            "it rewrites config.yaml and moves the earlier run's records aside to *.superseded-N"
        )
    else:
        with pytest.raises(ConfigError) as e:
            check_takeover(str(run), None)
        records = records.format(save=save)
        assert str(e.value).startswith(
            f"run_dir={str(run)!r}: holds the records of a run (config.yaml, {records}) that this "
            f"run does not continue (no --load); starting here would replace "
            f"its config.yaml. Fix: give this run its own --run-dir NEW_DIR, add --load {save} to "
            "resume it, or add --overwrite"
        ), str(e.value)
    assert check_takeover(str(run), str(save)) is None  # the run's own save: it continues
    assert sorted(os.listdir(run)) == before and (run / "metrics.jsonl").read_text() == metrics


@pytest.mark.parametrize("content", ["", "\n", "12\x00\x00", "iter_0000002"])
def test_empty_or_torn_tracker_is_named_with_the_fix(tmp_path, content):
    os.makedirs(tmp_path / "iter_0000002")
    (tmp_path / TRACKER).write_text(content)
    with pytest.raises(CheckpointError) as err:
        latest_iteration(str(tmp_path))
    message = str(err.value)
    assert message.startswith(f"{tmp_path / TRACKER}: holds {content.strip()!r}")
    assert "the newest iter_N here is 2" in message and "Fix: " in message


@pytest.mark.parametrize("saved", [[2, 5], []])
def test_a_tracker_naming_a_missing_iteration_is_refused_wherever_a_root_is_resolved(
    tmp_path, saved
):
    """A stale or hand-edited tracker (a rollback to a deleted iteration) is not passed over for
    the newest iter_N: pretrain --load, evaluate / export-hf and the layout lookups all stop,
    naming the tracker, the iteration, those that exist and the fix (as Megatron-LM stops)."""
    from megatron_gamma.config import load_config
    from megatron_gamma.rundir import checkpoint
    from megatron_gamma.training.loop import preflight

    save = tmp_path / "ckpt"
    for it in saved:
        os.makedirs(layout.checkpoint_dir(str(save), it))
        (save / f"iter_{it:07d}" / "metadata.json").write_text("{}")
    os.makedirs(save, exist_ok=True)
    (save / TRACKER).write_text("9\n")
    here = "the iterations here are 2, 5" if saved else "no iter_N is here"
    want = (
        f"{save / TRACKER}: names iteration 9, but {save / 'iter_0000009'} does not exist ({here}; "
    )
    run = {"mock_data": True, "run_dir": str(tmp_path / "run"), "load": str(save)}
    for read in (
        lambda: latest_iteration(str(save)),
        lambda: layout.resolve_checkpoint(str(save)),
        lambda: checkpoint.resolve(str(save)),  # evaluate, export-hf
        lambda: preflight(load_config(None, run)),  # pretrain --load
    ):
        with pytest.raises(CheckpointError) as err:
            read()
        assert str(err.value).startswith(want), str(err.value)
        assert "Fix: write the iteration to resume from into it, or delete it" in str(err.value)


def _pretrain(tmp_path, demo_prefix, save, *flags):
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path / "run")]
    return run_cli([*args, *TINY_MODEL, "--train-iters", "2", "--save", str(save), *flags])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_without_save_says_so_beside_its_run_directory(tmp_path, demo_prefix):
    """Trial 15: a run without --save learned that it writes no checkpoint only from its last
    line (the start-up warning had scrolled away); it is said again beside the run directory,
    before the first iteration, so the run can be stopped at once."""
    run = tmp_path / "run"
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(run), *TINY_MODEL]
    proc = run_cli([*args, "--train-iters", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"run directory {run}: config.yaml, metrics.jsonl; TensorBoard events in "
        f"{run / 'tensorboard'}\nno checkpoint will be written (no --save): to keep this run's "
        "weights, stop it now and start it again with --save DIR\ntraining iterations 1 to 1"
    ) in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.rstrip().endswith("no checkpoint written (no --save)")
    assert not os.path.exists(run / "checkpoints")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_save_dir_of_another_run_needs_load_or_overwrite(tmp_path, demo_prefix):
    save = tmp_path / "ckpt"
    os.makedirs(save / "iter_0000007")
    (save / TRACKER).write_text("7")
    refused = _pretrain(tmp_path, demo_prefix, save)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert (  # trial 15: it may be this run's own, started again without --load
        f"save={str(save)!r}: holds checkpoints (newest iter_0000007) that this run does not "
        "load (no --load)"
    ) in refused.stderr
    assert sorted(os.listdir(save)) == ["iter_0000007", TRACKER]
    assert not os.path.exists(tmp_path / "run" / "config.yaml")  # refused before anything
    replaced = _pretrain(tmp_path, demo_prefix, save, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert sorted(os.listdir(save)) == ["iter_0000002", TRACKER]
    assert (save / TRACKER).read_text() == "2"
    said = f"--overwrite: deleted the earlier run's checkpoints in {save}: iter_0000007\n"
    assert said in replaced.stdout, replaced.stdout[-3000:]
    run = tmp_path / "run"
    assert (
        f"run directory {run}: config.yaml, metrics.jsonl; TensorBoard events in "
        f"{run / 'tensorboard'}\ntraining iterations 1 to 2: a line every 5 iterations and at "
        "the last\n"
    ) in replaced.stdout  # said before the first step: a log without a terminal is silent
    assert {"config.yaml", "metrics.jsonl", "tensorboard"} <= set(os.listdir(run))  # as named
    assert re.search(
        r"done: iteration 2, validation loss \d\.\d{4} \(2 iterations trained\)\n$", replaced.stdout
    )
    # with --load, --overwrite deletes nothing (it counts only without --load): a resume
    resumed = _pretrain(tmp_path, demo_prefix, save, "--overwrite", "--load", str(save))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 2" in resumed.stdout, resumed.stdout[-3000:]
    assert "--overwrite: deleted" not in resumed.stdout
    assert "training iterations" not in resumed.stdout  # nothing left to train
    assert f"WARNING: overwrite=True: no effect, this run resumes from load={str(save)!r}" in (
        resumed.stdout
    )
    assert resumed.stdout.rstrip().endswith(
        "done: iteration 2 (nothing trained: the run was already at --train-iters or "
        "--exit-interval)"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seed", str(2**32)], "seed=4294967296: must lie in [0, 2**32 - 1]"),
        (["--seed", "-5"], "seed=-5: must lie in [0, 2**32 - 1]"),
        (["--make-vocab-size-divisible-by", "0"], "make_vocab_size_divisible_by=0: must be >= 1"),
        (
            ["--data-cache-path", "/proc/nope"],
            "data_cache_path='/proc/nope': nothing can be created",
        ),
        (
            ["--tensorboard-dir", "/proc/nope"],
            "tensorboard_dir='/proc/nope': nothing can be created",
        ),
        (["--adam-beta1", "2"], "adam_beta1=2.0: must lie in [0, 1)"),
        (["--weight-decay", "-1"], "weight_decay=-1.0: must be >= 0"),
    ],
)
def test_overwrite_deletes_nothing_before_every_value_is_checked(
    tmp_path, demo_prefix, flags, message
):
    """--overwrite deleted the earlier run's checkpoints, and only then did these values fail (a
    numpy, ZeroDivisionError or megatron-core traceback): the user was left with no checkpoint
    and no run. Each is refused with the key and the fix before anything is deleted."""
    save = tmp_path / "ckpt"
    os.makedirs(save / "iter_0000007")
    (save / TRACKER).write_text("7")
    refused = _pretrain(tmp_path, demo_prefix, save, "--overwrite", *flags)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert message in refused.stderr and "Fix: " in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert "--overwrite: deleted" not in refused.stdout
    assert sorted(os.listdir(save)) == ["iter_0000007", TRACKER]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_writer_of_a_save_dir_is_refused(tmp_path, demo_prefix):
    save = tmp_path / "ckpt"
    os.makedirs(save)
    with open(save / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 on the-first-writer\n")
        held.flush()
        second = _pretrain(tmp_path, demo_prefix, save)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "another process is writing checkpoints into it (pid 1 on the-first-writer" in (
        second.stderr
    )
    assert sorted(os.listdir(save)) == [".lock"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_run_in_a_live_run_dir_is_refused(tmp_path, demo_prefix):
    run = tmp_path / "run"
    os.makedirs(run)
    with open(run / ".run.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 on the-first-run\n")
        held.flush()
        second = _pretrain(tmp_path, demo_prefix, tmp_path / "ckpt")
    assert second.returncode == 2, second.stderr[-3000:]
    assert (
        f"run_dir={str(run)!r}: another run is writing into it (pid 1 on the-first-run holds "
        f"{run / '.run.lock'}). Fix: give this run its own --run-dir DIR"
    ) in second.stderr
    assert sorted(os.listdir(run)) == [".run.lock"]  # refused before anything was written
    assert not os.path.exists(tmp_path / "ckpt")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_refused_resume_leaves_the_run_directory_as_it_was(tmp_path, demo_prefix, monkeypatch):
    """A resume refused at the checkpoint load (another --gated-attention: tensors of other
    shapes) changes no file of the run directory, config.yaml least of all; its refusal names the
    setting this run changed, with both values (trial 15: it named only the tensors, the flag
    left to guess); nor does it open a W&B run (its files would go to RUN/wandb). The resume that
    loads records its config there."""
    run, save = tmp_path / "run", tmp_path / "run" / "ckpt"
    first = _pretrain(tmp_path, demo_prefix, save, "--train-iters", "4", "--exit-interval", "2",
                      "--init-audit", "summary")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    before, names = files(), sorted(os.listdir(run))
    assert {"config.yaml", "metrics.jsonl", "init_audit.json"} <= set(before)
    wandb = ["--wandb-project", "p"] if HAVE_WANDB else []
    monkeypatch.setenv("WANDB_MODE", "offline")
    refused = _pretrain(tmp_path, demo_prefix, save, "--train-iters", "4", "--gated-attention",
                        "headwise", "--load", str(save), *wandb)  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "cannot be loaded into this run: it holds tensors of other shapes" in refused.stderr
    assert "linear_gate.weight: checkpoint 2x64x64, this run 2x4x64" in refused.stderr
    assert (
        "Fix: build the model as the checkpoint was: this run changed "
        "gated_attention='headwise' (the run had 'elementwise'); drop those flags"
    ) in refused.stderr
    assert files() == before  # config.yaml byte for byte, metrics.jsonl, init_audit.json
    assert sorted(os.listdir(run)) == names

    resumed = _pretrain(tmp_path, demo_prefix, save, "--train-iters", "4", "--load", str(save),
                        "--log-interval", "2")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 2" in resumed.stdout
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["logging"]["log_interval"] == 2 and config["checkpoint"]["load"] == str(save)
    assert config["model"]["num_layers"] == 2 and config["training"]["exit_interval"] is None
    assert (run / "init_audit.json").read_bytes() == before["init_audit.json"]  # the run's start


def _train_losses(tb_dir) -> list[int]:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_fresh_run_does_not_take_over_another_runs_directory(tmp_path, demo_prefix):
    run, save = tmp_path / "run", tmp_path / "run" / "ckpt"
    first = _pretrain(tmp_path, demo_prefix, save, "--train-iters", "4", "--exit-interval", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    config, metrics = (run / "config.yaml").read_bytes(), (run / "metrics.jsonl").read_bytes()
    for flags in ([], ["--load", str(tmp_path / "other")]):  # a fresh start; another run's load
        refused = _pretrain(tmp_path, demo_prefix, tmp_path / "ckpt2", "--seed", "7", *flags)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert (
            f"run_dir={str(run)!r}: holds the records of a run (config.yaml, metrics.jsonl and "
            "ckpt/iter_0000003)" in refused.stderr
        )
        assert f"Fix: give this run its own --run-dir NEW_DIR, add --load {save} to" in (
            refused.stderr
        )
        why = f"load={str(tmp_path / 'other')!r} is elsewhere" if flags else "no --load"
        assert f"that this run does not continue ({why}); starting here" in (refused.stderr)
        assert (run / "config.yaml").read_bytes() == config
        assert (run / "metrics.jsonl").read_bytes() == metrics
    assert not os.path.exists(run / "tensorboard.superseded-1")
    assert layout.latest_iteration(str(save)) == 3

    # the same run resuming from its checkpoints (--load its save) continues in it
    resumed = _pretrain(tmp_path, demo_prefix, save, "--train-iters", "4", "--load", str(save))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 3" in resumed.stdout
    assert _train_losses(run / "tensorboard") == [1, 2, 3, 4]

    # --overwrite starts afresh: the earlier records and events are moved aside, not mixed in
    afresh = _pretrain(tmp_path, demo_prefix, tmp_path / "ckpt2", "--overwrite")
    assert afresh.returncode == 0, afresh.stderr[-3000:]
    assert [r["iteration"] for r in layout.read_metrics(str(run)) if r["split"] == "train"] == [
        1,
        2,
    ]
    assert _train_losses(run / "tensorboard") == [1, 2]
    assert _train_losses(run / "tensorboard.superseded-1") == [1, 2, 3, 4]
    assert layout.resolve_checkpoint(str(run)) == layout.checkpoint_dir(str(tmp_path / "ckpt2"), 2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_that_never_finished_an_iteration_leaves_its_directory_to_the_rerun(
    tmp_path, demo_prefix
):
    """Trial 14 #4: a run stopped at its first step (here a NaN loss) left config.yaml, the
    iteration-0 diagnostics in metrics.jsonl and an empty --save, and the rerun was refused as
    "another run" whose resume (--load of that empty --save) could not work: --overwrite was
    the only way on. The rerun now takes the directory over, saying so, and moves the failed
    run's records aside (nothing deleted); so does a resume of another run's checkpoint there,
    which keeps none of them (they are not its run's)."""
    run, save = tmp_path / "run", tmp_path / "run" / "ckpt"
    notice = f"run_dir={str(run)!r}: held a run that never finished an iteration (config.yaml; "
    for base in (tmp_path, tmp_path / "b"):
        crashed = _pretrain(base, demo_prefix, base / "run" / "ckpt", *OVERFLOW)
        assert crashed.returncode == 1, crashed.stderr[-3000:]
        assert "iteration 1: training loss nan" in crashed.stderr
        assert os.listdir(base / "run" / "ckpt") == []
        assert {r["iteration"] for r in layout.read_metrics(str(base / "run"))} == {0}
    left = {n: (run / n).read_bytes() for n in ("config.yaml", "metrics.jsonl", "init_audit.json")}

    rerun = _pretrain(tmp_path, demo_prefix, save, "--seed", "7", "--train-iters", "3",
                      "--exit-interval", "2")  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stdout.count(notice) == 1, rerun.stdout[-3000:]
    assert rerun.stdout.count(f"{run} holds records of earlier runs set aside by 1 start (") == 1
    assert yaml.safe_load((run / "config.yaml").read_text())["training"]["seed"] == 7
    assert (run / "metrics.superseded-1.jsonl").read_bytes() == left["metrics.jsonl"]
    assert (run / "init_audit.superseded-1.json").read_bytes() == left["init_audit.json"]
    assert (run / "init_audit.json").read_bytes() != left["init_audit.json"]  # seed 7's own
    assert sorted(read_metrics(run)["train"]) == [1, 2]
    assert _train_losses(run / "tensorboard") == [1, 2]
    assert os.listdir(run / "tensorboard.superseded-1")  # the failed run's iteration-0 events
    assert layout.latest_iteration(str(save)) == 2

    other = tmp_path / "b" / "run"
    left = {n: (other / n).read_bytes() for n in ("metrics.jsonl", "init_audit.json")}
    resumed = _pretrain(tmp_path / "b", demo_prefix, other / "ckpt", "--seed", "7",
                        "--train-iters", "3", "--load", str(save))  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 2" in resumed.stdout
    assert resumed.stdout.count(notice.replace(str(run), str(other))) == 1
    assert resumed.stdout.count(f"{other} holds records of earlier runs set aside by 1 start") == 1
    assert "the audit of the run's start is not in this run directory" in resumed.stdout
    assert {r["iteration"] for r in layout.read_metrics(str(other))} == {3}
    assert (other / "metrics.superseded-1.jsonl").read_bytes() == left["metrics.jsonl"]
    assert (other / "init_audit.superseded-1.json").read_bytes() == left["init_audit.json"]
    assert not (other / "init_audit.json").exists()
    assert _train_losses(other / "tensorboard") == [3]
    assert os.listdir(other / "tensorboard.superseded-1")

    # one finished iteration makes it another run's again
    again = _pretrain(tmp_path, demo_prefix, tmp_path / "ckpt3")
    assert again.returncode == 2, again.stderr[-3000:]
    assert f"run_dir={str(run)!r}: holds the records of a run (config.yaml, metrics.jsonl and " in (
        again.stderr
    )

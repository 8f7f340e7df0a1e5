"""Damaged or contested checkpoint directories: a torn tracker file is named with the fix; a run
without --load does not write into another run's checkpoints unless --overwrite; a second
writer of the same --save is refused while the first holds its lock."""

import fcntl
import os

import pytest
from helpers import TINY_MODEL, run_cli

from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.training.checkpointing import TRACKER, latest_iteration


@pytest.mark.parametrize("content", ["", "\n", "12\x00\x00", "iter_0000002"])
def test_empty_or_torn_tracker_is_named_with_the_fix(tmp_path, content):
    os.makedirs(tmp_path / "iter_0000002")
    (tmp_path / TRACKER).write_text(content)
    with pytest.raises(CheckpointError) as err:
        latest_iteration(str(tmp_path))
    message = str(err.value)
    assert message.startswith(f"{tmp_path / TRACKER}: holds {content.strip()!r}")
    assert "the newest iter_N here is 2" in message and "Fix: " in message


def _pretrain(tmp_path, demo_prefix, save, *flags):
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path / "run")]
    return run_cli([*args, *TINY_MODEL, "--train-iters", "2", "--save", str(save), *flags])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_save_dir_of_another_run_needs_load_or_overwrite(tmp_path, demo_prefix):
    save = tmp_path / "ckpt"
    os.makedirs(save / "iter_0000007")
    (save / TRACKER).write_text("7")
    refused = _pretrain(tmp_path, demo_prefix, save)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"save={str(save)!r}: holds checkpoints of another run (newest iter_0000007)" in (
        refused.stderr
    )
    assert sorted(os.listdir(save)) == ["iter_0000007", TRACKER]
    assert not os.path.exists(tmp_path / "run" / "config.yaml")  # refused before anything
    replaced = _pretrain(tmp_path, demo_prefix, save, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert sorted(os.listdir(save)) == ["iter_0000002", TRACKER]
    assert (save / TRACKER).read_text() == "2"
    # with --load, --overwrite deletes nothing (it counts only without --load): a resume
    resumed = _pretrain(tmp_path, demo_prefix, save, "--overwrite", "--load", str(save))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at iteration 2" in resumed.stdout, resumed.stdout[-3000:]


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

"""Ctrl-C in pretrain said only "interrupted": not that it saved nothing (SIGUSR1 and SIGTERM
save a checkpoint first), which checkpoint is the newest, or how to go on from it. The training
loop is replaced by one that is interrupted, so no model is built."""

import pytest

from megatron_gamma import cli

SAID = (
    "megatron-gamma pretrain: interrupted; Ctrl-C saves nothing (SIGUSR1 or SIGTERM saves a "
    "checkpoint first, then stops)"
)


@pytest.fixture
def interrupted(monkeypatch, tmp_path, capsys):
    """Run pretrain (the default config, mock data, --run-dir in tmp_path) with ``flags``, its
    training interrupted; returns (exit status, the last line on stderr)."""
    from megatron_gamma.training import loop

    def pretrain(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "pretrain", pretrain)

    def run(*flags: str) -> tuple[int, str]:
        args = ["pretrain", "--mock-data", "--run-dir", str(tmp_path / "run"), *flags]
        rc = cli.main(args)
        return rc, capsys.readouterr().err.rstrip("\n").split("\n")[-1]

    return run


def test_with_a_checkpoint_it_names_it_and_the_resume(interrupted, tmp_path):
    save = tmp_path / "ck"
    for it in (20, 30):
        (save / f"iter_00000{it}").mkdir(parents=True)
    (save / "iter_0000040.partial").mkdir()  # a save the interrupt cut short
    (save / "latest_checkpointed_iteration.txt").write_text("30")
    # --load too: the checkpoints are this run's own (pretrain refuses another run's in --save)
    assert interrupted("--save", str(save), "--load", str(save)) == (
        130,
        f"{SAID}; the newest complete checkpoint is {save}/iter_0000030 (iteration 30: what "
        f"was trained after it is lost). Fix: to go on from it, rerun with --load {save}",
    )


def test_without_a_checkpoint_it_says_there_is_nothing_to_resume(interrupted, tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    assert interrupted("--save", str(save)) == (
        130,
        f"{SAID}; {save} holds no complete checkpoint yet, so there is nothing to resume",
    )
    (save / "latest_checkpointed_iteration.txt").write_text("10")  # names no iter_0000010
    assert interrupted("--save", str(save))[1].endswith("holds no complete checkpoint yet, so "
                                                        "there is nothing to resume")  # fmt: skip


def test_without_save_and_without_the_sigterm_handler(interrupted):
    assert interrupted("--no-exit-signal-handler") == (
        130,
        "megatron-gamma pretrain: interrupted; Ctrl-C saves nothing (SIGUSR1 saves a checkpoint "
        "first, then stops), and this run has no --save: nothing of it can be resumed",
    )

"""A run launched with relative paths (``--data-path data/...``, ``--tokenizer-model data/...``,
``--run-dir runs/demo``, ``--save ckpt/demo``), read by ``evaluate`` from another directory: its
``config.yaml`` records the paths as given, and the read commands look for them, and for its
checkpoints, under the directory the run was launched from
(:func:`megatron_gamma.rundir.paths.launch_dirs`), then the current one.

Reference: ``evaluate`` of the same run from the launch directory, in the same process (the same
weights, samples and order of sums: the losses are equal, not close); for the resolution of each
kind of path, the files laid out by hand.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest
from conftest import DEMO_TOKENIZER, TINY_MODEL, run_cli

from megatron_gamma.config import ConfigError, load_config, save_config
from megatron_gamma.diagnostics.compare import compare
from megatron_gamma.evaluation.evaluate import evaluate
from megatron_gamma.rundir import loader
from megatron_gamma.rundir.checkpoint import TokenizerNotFoundError

ITERS = ["--train-iters", "2", "--eval-interval", "100", "--log-diagnostics-interval", "0"]
PREFIX = os.path.join("data", "demo_text_document")
TOKENIZER = os.path.join("data", "tok.json")
RUN = os.path.join("runs", "demo")
SAVE = os.path.join("ckpt", "demo")  # apart from the run directory, as Megatron-LM users keep it


@pytest.fixture(scope="module")
def launch(tmp_path_factory, demo_prefix) -> str:
    """A 2-iteration tiny run trained from LAUNCH with relative paths only; returns LAUNCH."""
    launch = tmp_path_factory.mktemp("relative_paths") / "launch"
    os.makedirs(launch / "data")
    for path in glob.glob(glob.escape(demo_prefix) + ".*"):
        shutil.copy(path, launch / "data" / os.path.basename(path))
    shutil.copy(DEMO_TOKENIZER, launch / TOKENIZER)
    args = ["pretrain", "--data-path", PREFIX, "--tokenizer-model", TOKENIZER, "--run-dir", RUN]
    args += ["--save", SAVE, *TINY_MODEL, *ITERS]
    proc = run_cli(args, cwd=launch)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return str(launch)


def _config_text(run: str) -> str:
    with open(os.path.join(run, "config.yaml"), encoding="utf-8") as f:
        return f.read()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_evaluate_from_another_directory_reads_the_paths_the_run_read(
    launch, tmp_path, monkeypatch
):
    run = os.path.join(launch, RUN)
    recorded = _config_text(run)
    assert f"- {PREFIX}\n" in recorded and f"tokenizer_model: {TOKENIZER}\n" in recorded
    with open(os.path.join(run, "launch.json"), encoding="utf-8") as f:
        assert json.load(f) == {"launch_dir": launch}  # written with config.yaml
    monkeypatch.chdir(launch)
    want = evaluate(RUN)
    os.makedirs(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    got = evaluate(run)
    assert want["source"] == got["source"] == "split"
    assert (got["iteration"], got["tokens"]) == (want["iteration"], want["tokens"]) == (2, 1024)
    assert got["loss"] == want["loss"]
    assert want["data"][0]["prefix"] == PREFIX  # unchanged where the cwd holds it
    assert got["data"][0]["prefix"] == os.path.join(launch, PREFIX)
    assert _config_text(run) == recorded  # never rewritten


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_moved_run_without_its_inputs_names_the_directories_tried(launch, tmp_path, monkeypatch):
    other = tmp_path / "other"  # runs/demo and ckpt/demo moved under other/, the data left behind
    moved = other / RUN
    shutil.copytree(os.path.join(launch, RUN), moved)
    shutil.copytree(os.path.join(launch, SAVE), other / SAVE)
    recorded = _config_text(str(moved))
    os.makedirs(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    tried = (
        f"no directory tried holds it: {other} (where the run was launched from, by its "
        f"run_dir), {tmp_path / 'elsewhere'} (the current directory)"
    )

    with pytest.raises(TokenizerNotFoundError) as err:
        evaluate(str(moved))
    assert f"'{TOKENIZER}' is relative, as {moved / 'config.yaml'} records it, and " in str(
        err.value
    )
    assert tried in str(err.value)
    assert "Fix: restore it, run from the directory the run was launched from" in str(err.value)
    with pytest.raises(TokenizerNotFoundError) as err:  # compare said only "not found"
        compare(str(moved), str(moved), os.path.join(launch, PREFIX), str(tmp_path / "c"))
    assert tried in str(err.value) and "or pass --config-a with a config.yaml" in str(err.value)
    assert not os.path.exists(tmp_path / "c")

    os.makedirs(other / "data")
    shutil.copy(DEMO_TOKENIZER, other / TOKENIZER)  # found under the launch directory now
    with pytest.raises(ConfigError) as err:
        evaluate(str(moved))
    assert str(err.value) == (
        f"data_path='{PREFIX}': {PREFIX}.bin does not exist: '{PREFIX}' is relative, as "
        f"{moved / 'config.yaml'} records it, and {tried}. Fix: run this command from the "
        "directory the run was launched from, or pass --data-path PREFIX (a path from the "
        "current directory)"
    )
    assert _config_text(str(moved)) == recorded


def _touch(*paths) -> None:
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()


def test_only_the_paths_a_run_config_records_are_read_from_the_launch_directory(
    tmp_path, monkeypatch
):
    launch, elsewhere = tmp_path / "launch", tmp_path / "elsewhere"
    for root, name in ((launch, "a"), (launch, "b"), (launch, "v"), (elsewhere, "b")):
        _touch(root / "data" / f"{name}.bin", root / "data" / f"{name}.idx")
    _touch(launch / "data" / "only.bin", launch / TOKENIZER)  # .bin without .idx: no dataset
    blend = ["0.3", "data/a", "0.7", "data/b"]  # weights and prefixes interleave
    cfg = load_config(
        None,
        {
            "train_data_path": blend,
            "valid_data_path": ["data/v"],
            "test_data_path": ["data/only"],
            "tokenizer_model": TOKENIZER,
            "data_cache_path": "cache",
            "run_dir": RUN,
        },
    )
    os.makedirs(launch / RUN)
    save_config(cfg, str(launch / RUN / "config.yaml"))
    monkeypatch.chdir(elsewhere)

    recorded = loader.recorded_paths(str(launch / RUN / "checkpoints" / "iter_0000002"))
    assert recorded.source == str(launch / RUN / "config.yaml")
    assert recorded.dirs == (str(launch), str(elsewhere))
    d = loader.resolve_recorded(cfg, recorded).data
    at = str(launch / "data")  # the launch directory first, though the cwd holds data/b too
    assert d.train_data_path == ["0.3", f"{at}/a", "0.7", f"{at}/b"]
    assert d.valid_data_path == [f"{at}/v"]
    assert d.tokenizer_model == str(launch / TOKENIZER)
    assert (d.test_data_path, d.data_cache_path) == (["data/only"], "cache")  # as recorded
    assert loader.resolve_recorded(cfg, None) == cfg
    with pytest.raises(ConfigError, match=r"data/only.bin does not exist: 'data/only' is relative"):
        d.blend(recorded)

    monkeypatch.chdir(launch)  # from the launch directory the paths stay as they were given
    assert loader.resolve_recorded(cfg, loader.recorded_paths(str(launch / RUN))) == cfg


def test_a_run_dir_with_dotdot_is_read_from_the_launch_directory_it_records(tmp_path, monkeypatch):
    """``--run-dir ../w/r1 --save ../w/r1/ckpt`` launched from ``repo/``: the launch directory
    cannot be taken off the run directory's path, so ``RUN/launch.json`` records it; a run
    without the file, or moved (or copied) since, falls back to the inference and the cwd."""
    from megatron_gamma.rundir import layout, paths

    repo, run, elsewhere = tmp_path / "x" / "repo", tmp_path / "x" / "w" / "r1", tmp_path / "cwd"
    _touch(run / "ckpt" / "iter_0000002" / "metadata.json", repo / TOKENIZER)
    (run / "ckpt" / layout.TRACKER).write_text("2")
    os.makedirs(elsewhere)
    cfg = load_config(
        None,
        {"run_dir": "../w/r1", "save": "../w/r1/ckpt", "tokenizer_model": TOKENIZER},
    )
    save_config(cfg, str(run / "config.yaml"))
    monkeypatch.chdir(elsewhere)
    assert paths.launch_dirs(str(run), cfg.to_dict()) == [str(elsewhere)]  # before launch.json
    with pytest.raises(ConfigError, match=r"checkpoint.save='../w/r1/ckpt': no such directory"):
        layout.resolve_checkpoint(str(run))

    monkeypatch.chdir(repo)
    paths.write_launch_dir(str(run))  # as pretrain writes it, from its working directory
    monkeypatch.chdir(elsewhere)
    assert paths.launch_dirs(str(run), cfg.to_dict()) == [str(repo), str(elsewhere)]
    assert paths.recorded_save(str(run)) == ("../w/r1/ckpt", str(run / "ckpt"))
    assert layout.resolve_checkpoint(str(run)) == str(run / "ckpt" / "iter_0000002")
    resolved = loader.resolve_recorded(cfg, loader.recorded_paths(str(run)))
    assert resolved.data.tokenizer_model == str(repo / TOKENIZER)

    copy = tmp_path / "copy" / "r1"  # launch.json comes along, but leads to w/r1, not here
    shutil.copytree(run, copy)
    assert paths.recorded_launch_dir(str(copy), "../w/r1") is None
    assert paths.launch_dirs(str(copy), cfg.to_dict()) == [str(elsewhere)]
    (run / paths.LAUNCH).write_text("{not json")
    assert paths.launch_dirs(str(run), cfg.to_dict()) == [str(elsewhere)]

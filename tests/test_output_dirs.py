"""compare and evaluate wrote into any existing --output-dir (a tokenizer's folder, another
compare's output) and overwrote an earlier output without a word; analyze refused a directory
holding files it does not write and moved its own earlier output aside. All three now share one
check (:func:`~megatron_gamma.rundir.paths.check_replaced_dir`) and one writer
(:func:`~megatron_gamma.rundir.paths.replaced_dir`)."""

import json
import os
from types import SimpleNamespace

import pytest
import torch

from megatron_gamma import cli
from megatron_gamma.config import ConfigError
from megatron_gamma.rundir.paths import check_replaced_dir, replaced_dir

TOKENIZER_FILES = ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture
def tokenizer_dir(tmp_path):
    """A tokenizer's folder, as train-tokenizer writes it: no output of any command."""
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in TOKENIZER_FILES:
        (tok / name).write_text("{}")
    return tok


@pytest.fixture
def ckpt_and_data(tmp_path):
    """A checkpoint directory and a data prefix with its files: what the command line checks
    before the output directory."""
    run = tmp_path / "run"
    run.mkdir()
    data = str(tmp_path / "d")
    for suffix in (".bin", ".idx"):
        with open(data + suffix, "wb"):
            pass
    return str(run), data


@pytest.mark.parametrize("command", ["compare", "evaluate"])
def test_a_foreign_output_dir_is_refused_before_any_work(
    command, tokenizer_dir, ckpt_and_data, capsys
):
    run, data = ckpt_and_data
    args = {
        "compare": ["compare", run, run, "--data-path", data],
        "evaluate": ["evaluate", run, "--data-path", data],
    }[command]
    assert cli.main([*args, "--output-dir", str(tokenizer_dir)]) == 2
    noun = {"compare": "comparison", "evaluate": "evaluation"}[command]
    assert capsys.readouterr().err == (
        f"megatron-gamma {command}: error: output_dir={str(tokenizer_dir)!r}: holds "
        f"{', '.join(TOKENIZER_FILES)}, which {command} does not write; it replaces its output "
        f"directory whole (an earlier {noun} is moved aside to DIR.superseded-N), so it will not "
        "mix its files with these. Fix: pass a new --output-dir DIR, or move those files out\n"
    )
    assert sorted(os.listdir(tokenizer_dir)) == TOKENIZER_FILES


def test_evaluate_tasks_checks_its_default_output_dir(ckpt_and_data, tmp_path, monkeypatch, capsys):
    """With --tasks and no --output-dir, evaluate writes ./eval: a foreign ./eval is refused."""
    run, _ = ckpt_and_data
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "notes.md").write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["evaluate", run, "--tasks", "hellaswag"]) == 2
    assert "error: output_dir='eval': holds notes.md, which evaluate does not write" in (
        capsys.readouterr().err
    )


def test_a_run_directory_as_output_dir_names_a_subdirectory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("")
    with pytest.raises(ConfigError) as refused:
        check_replaced_dir(str(run), "compare")
    assert str(refused.value).endswith(
        "Fix: this is a run directory: pass a new --output-dir DIR (e.g. RUN/compare)"
    )
    with pytest.raises(ConfigError) as refused:
        check_replaced_dir(str(run), "analyze")
    assert str(refused.value).endswith(
        "Fix: this is a run directory: leave out --output-dir (RUN/analysis) or pass a new one"
    )


def test_each_command_accepts_its_own_earlier_output(tmp_path):
    own = {
        "analyze": ["analysis.json", "loss.png"],
        "compare": ["compare.json", "delta_sym_by_difficulty.csv", "tokens.npz"],
        "evaluate": ["eval.json", "eval.md", "eval_loss.json", ".hf_export.abc123"],
    }
    for command, names in own.items():
        out = tmp_path / command
        out.mkdir()
        for name in names:
            (out / name).write_text("")
        check_replaced_dir(str(out), command)  # no error
    foreign = tmp_path / "x"
    foreign.mkdir()
    (foreign / "eval.json").write_text("")
    with pytest.raises(ConfigError, match=r"holds eval\.json, which compare does not write"):
        check_replaced_dir(str(foreign), "compare")


def test_replaced_dir_moves_the_earlier_output_aside(tmp_path, capsys):
    out = tmp_path / "out"
    with replaced_dir(str(out), "compare") as tmp:
        (tmp_path / tmp / "compare.json").write_text("first")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    with replaced_dir(str(out), "compare") as tmp:
        (tmp_path / tmp / "compare.json").write_text("second")
    aside = tmp_path / "out.superseded-1"
    assert (out / "compare.json").read_text() == "second"
    assert (aside / "compare.json").read_text() == "first"
    assert sorted(os.listdir(tmp_path)) == ["out", "out.superseded-1"]
    assert f"{out}: the earlier comparison moved to {aside}" in capsys.readouterr().out
    with pytest.raises(OSError, match="disk full"):
        with replaced_dir(str(out), "compare") as tmp:
            (tmp_path / tmp / "compare.json").write_text("third")
            raise OSError("disk full")
    assert (out / "compare.json").read_text() == "second"
    assert sorted(os.listdir(tmp_path)) == ["out", "out.superseded-1"]


def test_compare_writes_its_output_dir_whole(tmp_path, monkeypatch, capsys):
    from megatron_gamma.diagnostics import compare, plots

    def plot(bins, labels, path, note):
        with open(path, "w") as f:
            f.write(f"{labels[0]} vs {labels[1]}{note}")
        return path

    monkeypatch.setattr(plots, "plot_compare", plot)
    bins = [SimpleNamespace(as_dict=lambda: {"bin": 0, "mean_delta_sym": 0.5})]
    windows = torch.arange(10).reshape(2, 5)
    logp = torch.zeros(2, 4)

    def write(value: float) -> dict:
        summary = {"tokens": 8, "mean_delta_sym": value}
        return compare._write(
            summary, bins, ("A", "B"), windows, logp, logp, logp, logp, [0, 1], str(out)
        )

    out = tmp_path / "c"
    files = write(0.25)
    assert files == {
        "json": str(out / "compare.json"),
        "csv": str(out / "delta_sym_by_difficulty.csv"),
        "tokens": str(out / "tokens.npz"),
        "plot": str(out / "delta_sym_by_difficulty.png"),
    }
    assert (out / "delta_sym_by_difficulty.png").read_text() == "A vs B (8 tokens, 1 bins)"
    write(-0.5)
    assert json.loads((out / "compare.json").read_text())["mean_delta_sym"] == -0.5
    earlier = tmp_path / "c.superseded-1" / "compare.json"
    assert json.loads(earlier.read_text())["mean_delta_sym"] == 0.25
    assert f"the earlier comparison moved to {tmp_path / 'c.superseded-1'}" in (
        capsys.readouterr().out
    )


def test_evaluate_loss_writes_its_output_dir_whole(tmp_path, monkeypatch, capsys):
    from megatron_gamma.evaluation import evaluate as evaluate_module

    losses = iter([2.5, 2.25])

    def evaluate(ckpt, data_path, **_):
        return {
            "checkpoint": ckpt, "iteration": 9, "loss": next(losses), "perplexity": 12.0,
            "tokens": 64, "scored": "data",
        }  # fmt: skip

    monkeypatch.setattr(evaluate_module, "evaluate", evaluate)
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "e"
    for _ in range(2):
        assert cli.main(["evaluate", str(run), "--output-dir", str(out)]) == 0
    assert json.loads((out / "eval_loss.json").read_text())["loss"] == 2.25
    aside = tmp_path / "e.superseded-1"
    assert json.loads((aside / "eval_loss.json").read_text())["loss"] == 2.5
    stdout = capsys.readouterr().out
    assert f"{out}: the earlier evaluation moved to {aside}" in stdout
    assert stdout.count(f"wrote {out / 'eval_loss.json'}") == 2

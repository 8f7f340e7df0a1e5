"""Local data files named by the task files of ``evaluate --include-path``
(:mod:`megatron_gamma.evaluation.task_data`). Reference: ``datasets``' own resolution of
``data_files`` (``DataFilesDict.from_patterns``, what ``load_dataset`` calls), from the same
directory."""

from __future__ import annotations

import os

import pytest
import yaml

from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.task_data import check_task_data, missing_task_data

data_files = pytest.importorskip("datasets.data_files")


def _datasets_finds(files, base: str) -> bool:
    """Whether ``datasets`` resolves every entry of ``files`` from ``base``."""
    splits = files if isinstance(files, dict) else {"test": files}
    patterns = {k: v if isinstance(v, list) else [v] for k, v in splits.items()}
    try:
        data_files.DataFilesDict.from_patterns(patterns, base_path=base)
    except FileNotFoundError:
        return False
    return True


def _task(folder, name: str, files, **extra) -> None:
    spec = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": files}}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({**spec, **extra}))


CASES = {
    "relative, there": "data/here.jsonl",
    "relative, missing": "data/gone.jsonl",
    "absolute, missing": "/nonexistent-dir/x.jsonl",
    "a list, one missing": ["data/here.jsonl", "data/gone.jsonl"],
    "splits": {"train": "data/here.jsonl", "test": "data/gone.jsonl"},
    "splits, all there": {"test": ["data/here.jsonl"]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_file_is_missing_where_datasets_finds_none(tmp_path, case):
    """From the directory ``datasets`` reads relative paths from (the current one), a task is
    reported exactly when ``datasets`` cannot resolve its files; from another directory the
    relative ones go missing, as they do for ``datasets``."""
    (tmp_path / "run" / "data").mkdir(parents=True)
    (tmp_path / "run" / "data" / "here.jsonl").write_text('{"q": 1}\n')
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    files = CASES[case]
    _task(tasks, "t", files)
    for cwd in (tmp_path / "run", tmp_path):
        found = missing_task_data(str(tasks), ["t"], cwd=str(cwd))
        assert (not found) == _datasets_finds(files, str(cwd)), (case, cwd, found)
    assert found[0].startswith(f"task 't' ({tasks / 't.yaml'}) names data_files")


def test_urls_globs_other_tasks_and_includes(tmp_path):
    """A URL or a glob is left to ``datasets``; a task not asked for is not checked; a task's
    files come from its own ``dataset_kwargs``, else from an included file's (lm-eval's
    ``include:`` merge, the file's own keys replacing the base's)."""
    tasks, shared = tmp_path / "tasks", tmp_path / "shared"
    tasks.mkdir()
    shared.mkdir()
    _task(tasks, "url", "https://example.org/x.jsonl")
    _task(tasks, "glob", "data/*.jsonl")
    _task(tasks, "other", "gone.jsonl")
    (shared / "base.yaml").write_text(
        yaml.safe_dump({"dataset_path": "json", "dataset_kwargs": {"data_files": "base.jsonl"}})
    )
    (tasks / "inherits.yaml").write_text("include: ../shared/base.yaml\ntask: inherits\n")
    (tasks / "replaces.yaml").write_text(
        "include: ../shared/base.yaml\ntask: replaces\n"
        "dataset_kwargs: {data_files: {test: own.jsonl}}\n"
    )
    cwd = str(tmp_path)
    assert missing_task_data(str(tasks), ["url", "glob"], cwd=cwd) == []
    found = missing_task_data(str(tasks), ["inherits", "replaces"], cwd=cwd)
    assert [line.split(" names ")[1] for line in found] == [
        f"data_files 'base.jsonl': no file {os.path.join(cwd, 'base.jsonl')!r}",
        f"data_files (test) 'own.jsonl': no file {os.path.join(cwd, 'own.jsonl')!r}",
    ]
    (tmp_path / "base.jsonl").write_text("{}\n")
    found = missing_task_data(str(tasks), ["inherits", "replaces"], cwd=cwd)
    assert [line.split(" ")[1] for line in found] == ["'replaces'"]


def test_check_names_the_directory_and_the_fix(tmp_path, monkeypatch):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "t", {"test": "tests/lm_eval_tasks/tiny_mc.jsonl"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        check_task_data(str(tasks), ["t"])
    assert f"read from the current directory ({str(tmp_path)!r})" in str(e.value)
    assert "Fix: run from the directory those paths are relative to" in str(e.value)
    check_task_data(None, ["t"])
    check_task_data(str(tasks), ["not_asked"])

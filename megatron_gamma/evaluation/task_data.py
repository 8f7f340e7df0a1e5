"""Local data files that the task files of ``evaluate --include-path`` name, checked before
torch and lm-eval are imported.

A task YAML that reads local files (``dataset_path: json`` with ``dataset_kwargs.data_files``,
or ``csv``, ``parquet``, ...) hands them to ``datasets.load_dataset``, which reads a relative
path from the current directory, not from the YAML's. lm-eval finds such a file missing only when
it loads the task, after its own and torch's imports; :func:`check_task_data` names the task,
its file, the path and the directory it was read from at once.

Checked: the ``--tasks`` names that a task file under ``include_path`` defines (``task:``), its
``dataset_kwargs`` taken as lm-eval merges them (an ``include:``d file's keys first, the file's
own replacing them), each ``data_files`` entry (a string, a list, or a split mapping to either)
that is a plain local path: a URL (``://``) or a glob (``*?[``) is left to ``datasets``. A group
or tag name is not expanded; its tasks are checked when lm-eval loads them.
"""

from __future__ import annotations

import os

import yaml

from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.task_code import AnyTagLoader, listed, task_yaml_files

GLOB_CHARS = "*?["


def _document(path: str) -> dict:
    """The first mapping of the YAML file ``path`` (tags read as null), or {} if none or
    unreadable: lm-eval reports such a file itself."""
    try:
        with open(path, encoding="utf-8") as f:
            docs = list(yaml.load_all(f.read(), Loader=AnyTagLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return next((d for d in docs if isinstance(d, dict)), {})


def _merged(path: str, seen: frozenset[str] = frozenset()) -> dict:
    """The task file's keys as lm-eval's ``load_yaml_config`` merges them: each included file
    (relative to this one) first, in order, then the file's own keys replacing theirs."""
    path = os.path.realpath(path)
    if path in seen:
        return {}
    doc = _document(path)
    include = doc.get("include")
    merged: dict = {}
    for target in include if isinstance(include, list) else [include]:
        if isinstance(target, str) and target:
            merged.update(_merged(os.path.join(os.path.dirname(path), target), seen | {path}))
    merged.update({k: v for k, v in doc.items() if k != "include"})
    return merged


def _local_paths(data_files) -> list[tuple[str, str]]:
    """(split or '', path) of each plain local path in a ``data_files`` value."""
    if isinstance(data_files, dict):
        return [
            (str(split), path)
            for split, value in data_files.items()
            for _, path in _local_paths(value)
        ]
    values = data_files if isinstance(data_files, list) else [data_files]
    return [
        ("", v)
        for v in values
        if isinstance(v, str) and "://" not in v and not any(c in v for c in GLOB_CHARS)
    ]


def missing_task_data(include_path: str, tasks: list[str], cwd: str | None = None) -> list[str]:
    """One line per data file that a task of ``tasks`` defined under ``include_path`` names and
    that is not a file, read as ``datasets`` reads it: a relative path from ``cwd`` (default the
    current directory).

    Args:
        include_path: the ``--include-path`` directory.
        tasks: the ``--tasks`` names.
        cwd: the directory relative paths are read from.

    Returns:
        Sorted lines naming the task, its YAML file, the split and the path as written.
    """
    cwd = os.getcwd() if cwd is None else cwd
    wanted, found = set(tasks), []
    for path in task_yaml_files(include_path):
        cfg = _merged(path)
        task = cfg.get("task")
        if not isinstance(task, str) or task not in wanted:
            continue
        kwargs = cfg.get("dataset_kwargs")
        files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        for split, file in _local_paths(files):
            full = os.path.join(cwd, file)
            if not os.path.isfile(full):
                where = f" ({split})" if split else ""
                found.append(
                    f"task {task!r} ({path}) names data_files{where} {file!r}: no file {full!r}"
                )
    return sorted(found)


def check_task_data(include_path: str | None, tasks: list[str]) -> None:
    """Refuse ``--tasks`` whose task files under ``include_path`` name local data files that do
    not exist (:func:`missing_task_data`).

    Raises:
        ConfigError: naming each missing file, the directory relative paths are read from, and
            the fix.
    """
    if include_path is None or not tasks:
        return
    found = missing_task_data(include_path, tasks)
    if found:
        raise ConfigError(
            f"--include-path={include_path!r}: {listed(found)}. A relative data_files path is "
            f"read from the current directory ({os.getcwd()!r}), not from the task file's. Fix: "
            "run from the directory those paths are relative to, or write them as absolute paths"
        )

"""Python code that the task YAML files of ``evaluate --include-path`` would make lm-eval run.

lm-eval reads a task YAML with its ``!function module.name`` tag by importing ``module.py`` from
beside the file (``lm_eval.utils.import_function``), at task loading, before any model is
scored. A task directory from elsewhere is input like a checkpoint: its code runs only when the
user says so (``--trust-task-code``). The tag is found by PyYAML's parser, which resolves it as
lm-eval's loader does (a ``%TAG`` handle, a verbatim ``!<!function>``), in every ``*.yaml`` /
``*.yml`` under the directory, as lm-eval's ``TaskManager`` walks it, and in each file their
``include:`` keys name (lm-eval reads those too), without importing lm-eval: the command line
refuses such a directory before it imports torch. A file PyYAML cannot parse is searched as
text for the tag.
"""

from __future__ import annotations

import os
import re

import yaml

from megatron_gamma.config import ConfigError

FUNCTION_TAG = "!function"
"""lm-eval's YAML tag that imports a Python function."""


class _AnyTagLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading every tag it does not know (``!function`` included) as
    null: the document's plain structure, for its ``include:`` key, with no constructor run."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def _tags_and_include(text: str) -> tuple[bool, list[str]]:
    """Whether ``text`` uses :data:`FUNCTION_TAG`, and the ``include:`` values of its
    documents."""
    try:
        tagged = any(
            getattr(e, "tag", None) == FUNCTION_TAG
            for e in yaml.parse(text, Loader=yaml.SafeLoader)
        )
        docs = list(yaml.load_all(text, Loader=_AnyTagLoader))
    except yaml.YAMLError:
        return bool(re.search(re.escape(FUNCTION_TAG) + r"\b", text)), []
    include = [d["include"] for d in docs if isinstance(d, dict) and "include" in d]
    return tagged, [x for x in include if isinstance(x, str)]


def _yaml_files(folder: str) -> list[str]:
    return sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(folder)
        for name in names
        if name.endswith((".yaml", ".yml"))
    )


def files_with_code(include_path: str) -> list[str]:
    """The task YAML files under ``include_path`` (and those they include) that hold lm-eval's
    ``!function`` tag, sorted.

    Raises:
        ConfigError: a file that cannot be read as UTF-8 text, named.
    """
    pending, seen, found = _yaml_files(include_path), set(), []
    while pending:
        path = os.path.realpath(pending.pop())
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"--include-path={include_path!r}: cannot read the task file {path!r} "
                f"({type(e).__name__}: {e}). Fix: pass a directory of readable task YAML files"
            ) from e
        tagged, include = _tags_and_include(text)
        if tagged:
            found.append(path)
        pending += [os.path.join(os.path.dirname(path), target) for target in include]
    return sorted(found)


def check_task_code(include_path: str | None, trust_task_code: bool) -> None:
    """Refuse an ``--include-path`` whose task files would run Python code (:func:`files_with_code`)
    unless ``trust_task_code``.

    Raises:
        ConfigError: naming the files and the fix.
    """
    if include_path is None or trust_task_code:
        return
    found = files_with_code(include_path)
    if found:
        listed = ", ".join(repr(p) for p in found[:5]) + (" ..." if len(found) > 5 else "")
        raise ConfigError(
            f"--include-path={include_path!r}: {len(found)} task file(s) use lm-eval's "
            f"'!function' tag ({listed}), which imports and runs the Python module beside the "
            "file. Fix: read that code, then pass --trust-task-code to let lm-eval run it, or "
            "remove the tag"
        )

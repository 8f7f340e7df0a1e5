"""Python code that the task files of ``evaluate --include-path`` would make lm-eval run, and the
sandbox its prompt templates render in.

lm-eval (0.4) runs code from a task directory three ways, each at task loading, before any model
is scored:

- the ``!function module.name`` YAML tag imports ``module.py`` from beside the file
  (``lm_eval.tasks._yaml_loader``);
- a ``metric:`` that lm-eval's own registry lacks, or one marked ``hf_evaluate: true``, goes to
  ``evaluate.load(name)``, which imports a metric script from a local path (or the Hub);
- the prompt templates (``doc_to_text``, ``doc_to_target``, ``doc_to_choice``, ...) render in a
  plain Jinja environment, where a template reaches Python objects
  (``{{ cycler.__init__.__globals__.os }}``).

A task directory from elsewhere is input like a checkpoint. The first two are refused unless the
user says they read that code (``--trust-task-code``): :func:`check_task_code` finds them with
PyYAML's parser, which resolves the tag as lm-eval's loader does (a ``%TAG`` handle, a verbatim
``!<!function>``), in every ``*.yaml`` under the directory as lm-eval's task index walks it
(``__pycache__`` and ``.ipynb_checkpoints`` skipped) and in each file their ``include:`` keys name
(a string or a list), before torch is imported. A file PyYAML cannot parse is searched as text
for the tag. The third is closed for every task, lm-eval's own included: :func:`sandbox_templates`
renders the templates in Jinja's sandbox, which refuses attributes such as ``__globals__``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import yaml

from megatron_gamma.config import ConfigError

FUNCTION_TAG = "!function"
"""lm-eval's YAML tag that imports a Python function."""
SKIPPED_DIRS = ("__pycache__", ".ipynb_checkpoints")
"""Directories lm-eval's task index does not read."""


class AnyTagLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading every tag it does not know (``!function`` included) as
    null: the document's plain structure, for its ``include:`` and ``metric_list`` keys, with no
    constructor run."""


AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


@dataclass
class _TaskFile:
    tagged: bool = False
    include: list[str] = field(default_factory=list)
    metrics: list[tuple[str, bool]] = field(default_factory=list)
    """(metric name, hf_evaluate) of each ``metric_list`` entry whose metric is a name."""


def _read(text: str) -> _TaskFile:
    try:
        tagged = any(
            getattr(e, "tag", None) == FUNCTION_TAG
            for e in yaml.parse(text, Loader=yaml.SafeLoader)
        )
        docs = list(yaml.load_all(text, Loader=AnyTagLoader))
    except yaml.YAMLError:
        return _TaskFile(tagged=bool(re.search(re.escape(FUNCTION_TAG) + r"\b", text)))
    out = _TaskFile(tagged=tagged)
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        include = doc.get("include")
        out.include += [x for x in (include if isinstance(include, list) else [include]) if x]
        for entry in doc.get("metric_list") or []:
            if isinstance(entry, dict) and isinstance(entry.get("metric"), str):
                out.metrics.append((entry["metric"], entry.get("hf_evaluate") is True))
    out.include = [x for x in out.include if isinstance(x, str)]
    return out


def listed(found: list[str], most: int = 5) -> str:
    """The first ``most`` of ``found`` joined by "; ", and how many more there are."""
    more = f"; and {len(found) - most} more" if len(found) > most else ""
    return "; ".join(found[:most]) + more


def task_yaml_files(folder: str) -> list[str]:
    """Every ``*.yaml`` under ``folder`` as lm-eval's task index walks it (:data:`SKIPPED_DIRS`
    not entered), sorted."""
    return sorted(
        os.path.join(root, name)
        for root, dirs, names in os.walk(folder)
        if not any(part in SKIPPED_DIRS for part in os.path.relpath(root, folder).split(os.sep))
        for name in names
        if name.endswith(".yaml")
    )


def task_code(include_path: str, known_metrics: frozenset[str] = frozenset()) -> list[str]:
    """What the task files under ``include_path`` (and those they include) would make lm-eval
    run: one line per file that holds the ``!function`` tag, and per metric that lm-eval's
    registry (``known_metrics``; empty: not checked) lacks or that is marked ``hf_evaluate``.

    Raises:
        ConfigError: a file that cannot be read as UTF-8 text, named.
    """
    pending, seen, found = task_yaml_files(include_path), set(), []
    while pending:
        path = os.path.realpath(pending.pop())
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8") as f:
                task = _read(f.read())
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"--include-path={include_path!r}: cannot read the task file {path!r} "
                f"({type(e).__name__}: {e}). Fix: pass a directory of readable task YAML files"
            ) from e
        if task.tagged:
            found.append(f"{path!r} uses the '{FUNCTION_TAG}' tag (imports the module beside it)")
        for name, hf in task.metrics:
            if hf or (known_metrics and name not in known_metrics):
                why = "marked hf_evaluate" if hf else "not in lm-eval's metric registry"
                found.append(
                    f"{path!r} names metric {name!r}, {why} (evaluate.load imports its script)"
                )
        pending += [os.path.join(os.path.dirname(path), target) for target in task.include]
    return sorted(found)


def _known_metrics() -> frozenset[str]:
    """The names in lm-eval's metric registry (importing it loads no model and no torch);
    empty without lm-eval, which then runs no task at all."""
    try:
        import lm_eval.api.metrics  # noqa: F401  (fills the registry)
        from lm_eval.api.registry import metric_registry
    except ImportError:
        return frozenset()
    return frozenset(metric_registry)


def check_task_code(include_path: str | None, trust_task_code: bool) -> None:
    """Refuse an ``--include-path`` whose task files would run Python code (:func:`task_code`,
    against lm-eval's metric registry) unless ``trust_task_code``.

    Raises:
        ConfigError: naming each file and what in it runs code, and the fix.
    """
    if include_path is None or trust_task_code:
        return
    found = task_code(include_path, _known_metrics())
    if found:
        raise ConfigError(
            f"--include-path={include_path!r}: its task files would make lm-eval run Python "
            f"code: {listed(found)}. Fix: read that code, then pass --trust-task-code to let "
            "lm-eval run it, or remove it"
        )


def sandbox_templates() -> None:
    """Render lm-eval's prompt templates in Jinja's sandbox (idempotent): ``lm_eval.utils.env``,
    the environment ``apply_template`` reads at each call, becomes a
    ``jinja2.sandbox.SandboxedEnvironment`` with its settings and its ``regex_replace`` filter,
    so a template that reaches for ``__globals__`` or another unsafe attribute raises
    ``jinja2.exceptions.SecurityError`` instead of running code."""
    import lm_eval.utils
    from jinja2.sandbox import SandboxedEnvironment

    if isinstance(lm_eval.utils.env, SandboxedEnvironment):
        return
    plain = lm_eval.utils.env
    env = SandboxedEnvironment(
        loader=plain.loader,
        undefined=plain.undefined,
        keep_trailing_newline=plain.keep_trailing_newline,
    )
    env.filters.update({k: v for k, v in plain.filters.items() if k not in env.filters})
    lm_eval.utils.env = env

"""``megatron-gamma evaluate CKPT --tasks ...``: lm-evaluation-harness on exported checkpoints.

Each checkpoint is exported with :func:`megatron_gamma.hf.hf_export.export_hf` into a
temporary directory and evaluated by ``lm_eval.simple_evaluate`` (model ``hf``,
``trust_remote_code=True``, fp32) with per-item samples logged. With ``compare``, the second
checkpoint is evaluated on the same tasks, which must give the same items and metric, and the
items are paired: per task, both scores, A - B and its paired-bootstrap interval
(:func:`megatron_gamma.evaluation.bootstrap.paired_bootstrap`). Writes ``eval.json`` and
``eval.md`` (a markdown table) into ``output_dir``.

Datasets come from wherever lm-eval finds them: the Hugging Face hub, its local cache, or local
files named in a task YAML (``dataset_path: json`` with ``dataset_kwargs.data_files``) under
``include_path``. When a dataset cannot be loaded the error names the task and the dataset.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Optional

import numpy as np

from megatron_gamma.atomic import atomic_write_text
from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.bootstrap import paired_bootstrap
from megatron_gamma.evaluation.device import lm_eval_device
from megatron_gamma.evaluation.errors import DatasetUnavailableError
from megatron_gamma.evaluation.task_code import check_task_code, sandbox_templates
from megatron_gamma.hf import bars_only_on_a_terminal
from megatron_gamma.hf.hf_export import export_hf
from megatron_gamma.rundir.paths import check_replaced_dir, replaced_dir

# Fewer items than this: eval.md does not show the paired-bootstrap interval. A rule of thumb:
# a percentile bootstrap over a handful of items is often degenerate (zero width when A and B
# agree on every item) and its coverage falls short of the nominal 95%.
MIN_ITEMS_FOR_INTERVAL = 30
_CONFIDENCE = 0.95  # eval.md's "95% CI"
PREFERRED_METRICS = ("acc_norm",)
"""Metrics reported in preference to a task's first mean-aggregated one, where it lists them:
the length-normalized accuracy that leaderboards quote for multiple-choice tasks."""

# The paper's three benchmarks plus zero-shot tasks that separate 0.1B-1.5B models.
SUGGESTED_TASKS = (
    "gsm8k",
    "minerva_math500",
    "hellaswag",
    "arc_easy",
    "arc_challenge",
    "piqa",
    "winogrande",
    "lambada_openai",
)


def _task_dict(tasks: list[str], task_manager) -> dict:
    """lm-eval's task objects (this downloads or reads the datasets), their prompt templates
    rendered in Jinja's sandbox (:func:`~.task_code.sandbox_templates`).

    Raises:
        DatasetUnavailableError: a task whose dataset cannot be loaded.
        ConfigError: an unknown task name.
    """
    from lm_eval.tasks import get_task_dict

    sandbox_templates()

    unknown = [t for t in tasks if not task_manager.match_tasks([t])]
    if unknown:
        raise ConfigError(
            f"tasks={unknown}: unknown to lm-eval. Fix: use names from `lm-eval ls tasks`, or "
            "pass --include-path DIR with your task YAML files"
        )
    out = {}
    for task in tasks:
        try:
            out.update(get_task_dict([task], task_manager))
        except Exception as e:  # datasets raises many types when offline or a file is missing
            entry = task_manager.task_index.get(task)
            cfg = (getattr(entry, "cfg", None) or {}) if entry is not None else {}
            files = (cfg.get("dataset_kwargs") or {}).get("data_files")
            dataset = cfg.get("dataset_path", task) + (f" {files}" if files else "")
            local = (
                f"a relative data_files path is read from the current directory "
                f"({os.getcwd()!r}): run from the directory it is relative to or make it "
                "absolute; for a Hub dataset, "
                if files
                else ""
            )
            raise DatasetUnavailableError(
                f"task={task!r}: its dataset {dataset!r} could not be loaded "
                f"({type(e).__name__}: {str(e)[:300]}). Fix: {local}run once with network "
                "access so the Hugging Face cache holds it (HF_HOME; on a node without network, "
                "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 so that cache is read at once "
                "instead of retrying the Hub for about a minute), or copy it locally and pass "
                "--include-path DIR with a task YAML using `dataset_path: json` and "
                "`dataset_kwargs: {data_files: {test: /path/to/file.jsonl}}`"
            ) from e
    return out


def _choose_metrics(task_objects: dict, tasks: list[str], paired: bool) -> dict[str, dict]:
    """The metric reported for each task, read from lm-eval's task objects before any model run.

    It is a metric whose lm-eval aggregation is the plain mean over items
    (``lm_eval.api.metrics.mean``): :data:`PREFERRED_METRICS` where the task lists one (HellaSwag,
    ARC, PIQA, OpenBookQA: ``acc_norm``, as leaderboards quote them), else the first such metric
    in the task's list (e.g. ``acc``, ``exact_match``). Its per-item values average to lm-eval's
    score, so two models' items can be paired. Other aggregations (``perplexity``: exp of minus
    the mean per-item log-likelihood; ``bits_per_byte``, ``f1``, ...) do not score an item on
    its own; a task with only such metrics reports its first one, unpaired.

    Args:
        task_objects: :func:`_task_dict`'s output.
        tasks: the task names asked for.
        paired: whether the items of two checkpoints will be paired (``--compare``).

    Returns:
        {task: {'name': e.g. 'acc', 'mean': aggregated by a mean over items, 'higher_is_better':
        lm-eval's direction for the metric (None where the task does not state it)}}.

    Raises:
        ConfigError: a group of tasks rather than one task; with ``paired``, a task none of whose
            metrics is aggregated by a mean over items.
    """
    from lm_eval.api.metrics import mean
    from lm_eval.api.task import Task

    out = {}
    for task in tasks:
        obj = task_objects.get(task)
        if not isinstance(obj, Task):
            raise ConfigError(
                f"tasks={task!r}: a group of lm-eval tasks, not one task; scores per item come "
                "from single tasks. Fix: name the group's tasks in --tasks instead"
            )
        aggregation = obj.aggregation()
        means = [name for name, fn in aggregation.items() if fn is mean]
        if paired and not means:
            raise ConfigError(
                f"tasks={task!r}: none of its metrics {list(aggregation)} is aggregated by a mean "
                "over items, so its items cannot be paired between two checkpoints (a perplexity's "
                "per-item values are log-likelihoods, not scores). Fix: drop it from --tasks when "
                "using --compare, and evaluate each checkpoint on it alone"
            )
        preferred = [m for m in PREFERRED_METRICS if m in means]
        name = (preferred or means or list(aggregation))[0]
        out[task] = {
            "name": name,
            "mean": bool(means),
            "higher_is_better": obj.higher_is_better().get(name),
        }
    return out


def _task_result(task: str, metric: dict, result: dict, samples: list[dict]) -> dict:
    """One task's score from lm-eval's output, with per-item scores for a mean-aggregated metric.

    The filter is the first one lm-eval lists for the metric (e.g. gsm8k's 'strict-match').

    Args:
        task: task name (for messages).
        metric: the task's entry of :func:`_choose_metrics`.
        result: ``simple_evaluate(...)['results'][task]``, e.g. {'acc,none': 0.5, ...}.
        samples: ``simple_evaluate(..., log_samples=True)['samples'][task]``: one dict per item and
            filter with 'doc_id', 'filter' and the metric's per-item value.

    Returns:
        {'metric': e.g. 'acc,none', 'score': lm-eval's aggregate, 'higher_is_better', 'n': items
        scored, and with a mean-aggregated metric 'items': {doc_id: per-item value}}.

    Raises:
        ValueError: lm-eval reported no such metric, a doc_id twice, or (mean-aggregated) a score
            that is not the mean of its per-item values.
    """
    name = metric["name"]
    keys = [k for k in result if k.split(",", 1)[0] == name]
    if not keys:
        raise ValueError(f"task={task!r}: lm-eval reported no {name!r} in {sorted(result)}")
    key = keys[0]
    filt = key.split(",", 1)[1]
    rows = [s for s in samples if s["filter"] == filt]
    doc_ids = [int(s["doc_id"]) for s in rows]
    if len(set(doc_ids)) != len(doc_ids):
        raise ValueError(f"task={task!r}: lm-eval logged a doc_id twice for {key!r}")
    out = {
        "metric": key,
        "score": float(result[key]),
        "higher_is_better": metric["higher_is_better"],
        "n": len(rows),
    }
    if metric["mean"]:
        items = {d: float(s[name]) for d, s in zip(doc_ids, rows, strict=True)}
        item_mean = math.fsum(items.values()) / len(items) if items else math.nan
        if not math.isclose(out["score"], item_mean, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(
                f"task={task!r}: lm-eval's {key} = {out['score']!r} is not the mean "
                f"{item_mean!r} of its {len(items)} logged items, so they cannot be paired"
            )
        out["items"] = items
    return out


@contextlib.contextmanager
def quiet_git_probe():
    """For the block, lm-eval's probe of the current directory's git commit (``git describe``,
    recorded in its results) runs with the process's standard error at /dev/null: outside a
    repository git printed "fatal: not a git repository" once per evaluated model, which read
    as a failure (trial 13). Wraps ``lm_eval.evaluator.get_git_commit_hash``; its result is
    unchanged."""
    import lm_eval.evaluator as evaluator

    probe = evaluator.get_git_commit_hash

    def quiet():
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            return probe()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = probe


def run_lm_eval(
    model_dir: str,
    tasks: list[str],
    metrics: dict[str, dict],
    *,
    include_path: Optional[str] = None,
    num_fewshot: Optional[int] = None,
    limit: Optional[float] = None,
    batch_size: int = 1,
    device: str = "cpu",
) -> dict:
    """Evaluate one Hugging Face model directory on lm-eval tasks.

    Args:
        metrics: :func:`_choose_metrics`'s output for ``tasks``.

    Returns:
        {task: :func:`_task_result`}.

    Raises:
        DatasetUnavailableError: a dataset that cannot be loaded.
        ValueError: see :func:`_task_result`.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    with bars_only_on_a_terminal(), quiet_git_probe():  # transformers' Loading weights
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args={
                "pretrained": model_dir,
                "trust_remote_code": True,
                "dtype": "float32",
                "device": device,
            },
            tasks=list(_task_dict(tasks, manager).values()),
            num_fewshot=num_fewshot,
            limit=limit,
            batch_size=batch_size,
            log_samples=True,
            task_manager=manager,
            bootstrap_iters=0,
        )
    return {
        task: _task_result(task, metrics[task], out["results"][task], out["samples"][task])
        for task in tasks
    }


def _paired_items(task: str, a: dict, b: dict) -> tuple[np.ndarray, np.ndarray]:
    """A's and B's per-item values of one task, both (n,) and in doc_id order.

    Args:
        a, b: the task's :func:`_task_result` for checkpoints A and B (mean-aggregated metric).

    Raises:
        ValueError: A and B report different metrics (or filters), or scored different doc_id
            sets; the message names the task, the metric(s) and the counts.
    """
    if a["metric"] != b["metric"]:
        raise ValueError(
            f"task={task!r}: A reports {a['metric']!r} and B {b['metric']!r}; a paired comparison "
            "needs one metric. Fix: evaluate both with the same lm-eval version and task files"
        )
    ids_a, ids_b = set(a["items"]), set(b["items"])
    if ids_a != ids_b:
        raise ValueError(
            f"task={task!r}, metric {a['metric']!r}: A scored {len(ids_a)} items, B {len(ids_b)}, "
            f"{len(ids_a & ids_b)} in common; a paired comparison needs the same items. Fix: keep "
            "the task's dataset fixed between the two runs (e.g. a local copy through "
            "--include-path) and rerun"
        )
    docs = sorted(ids_a)
    return np.array([a["items"][d] for d in docs]), np.array([b["items"][d] for d in docs])


def _label(exported: dict) -> str:
    return f"{exported['checkpoint']} (iteration {exported['iteration']})"


def _better(entry: dict) -> str:
    """The direction lm-eval marks as better for the entry's metric."""
    return {True: "higher", False: "lower", None: "not stated"}[entry["higher_is_better"]]


def _table(report: dict) -> str:
    """eval.md: a markdown table of ``report`` (:func:`benchmark`'s output) and notes on reading
    it; with B, intervals from fewer than ``MIN_ITEMS_FOR_INTERVAL`` items are not shown."""
    metric_note = (
        "- metric: per task, acc_norm where lm-eval lists it, else the first metric lm-eval "
        "lists that it aggregates as a mean over items{alone}, with the first filter lm-eval lists "
        "for it; better: the direction lm-eval marks as better for that metric."
    )
    if report["b"] is None:
        rows = ["| task | metric | better | n | score |", "|---|---|---|---:|---:|"]
        for task, r in report["tasks"].items():
            rows.append(f"| {task} | {r['metric']} | {_better(r)} | {r['n']} | {r['a']:.4f} |")
        notes = [metric_note.format(alone=" (else its first metric)")]
        return "\n".join(rows + [""] + notes) + "\n"
    boot = report["bootstrap"]
    rows = [
        f"A = {report['a']}  \nB = {report['b']}\n",
        "| task | metric | better | n | A | B | A − B | 95% CI (paired bootstrap) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for task, r in report["tasks"].items():
        if r["n"] < MIN_ITEMS_FOR_INTERVAL:
            interval = f"not shown: n < {MIN_ITEMS_FOR_INTERVAL}"
        else:
            interval = f"[{r['low']:+.4f}, {r['high']:+.4f}]"
        rows.append(
            f"| {task} | {r['metric']} | {_better(r)} | {r['n']} | {r['a']:.4f} | {r['b']:.4f} | "
            f"{r['diff']:+.4f} | {interval} |"
        )
    k = len(report["tasks"])
    notes = [
        "- A, B: lm-eval's score of each checkpoint; A − B: their difference.",
        metric_note.format(alone=""),
        "- 95% CI: percentile paired bootstrap over the task's n items (items drawn with "
        f"replacement, each keeping its A and B scores; {boot['samples']} resamples, seed "
        f"{boot['seed']}). It reflects only which items were sampled, for these two fixed "
        "checkpoints: it says nothing about other training seeds of either run, or about the "
        "two methods in general.",
        f"- One 95% interval per task, {k} task{'s' if k != 1 else ''}, with no adjustment for "
        "multiple comparisons: across several tasks, some interval may exclude 0 by chance.",
        f"- Tasks with n < {MIN_ITEMS_FOR_INTERVAL}: the interval is not shown (too few items "
        "for a percentile bootstrap interval to be read as a 95% CI); eval.json keeps it.",
    ]
    return "\n".join(rows + [""] + notes) + "\n"


def _write(path: str, text: str) -> None:
    atomic_write_text(path, text)


def benchmark(
    ckpt: str,
    tasks: list[str],
    output_dir: str,
    *,
    compare: Optional[str] = None,
    config: Optional[str] = None,
    compare_config: Optional[str] = None,
    include_path: Optional[str] = None,
    trust_task_code: bool = False,
    num_fewshot: Optional[int] = None,
    limit: Optional[float] = None,
    batch_size: int = 1,
    device: str = "cpu",
    bootstrap_samples: int = 10000,
    seed: int = 0,
) -> dict:
    """Benchmark a checkpoint (and optionally compare it with another) with lm-eval.

    Args:
        ckpt: checkpoint A (``SAVE/iter_N``, checkpoint root or run directory).
        tasks: lm-eval task names.
        output_dir: where eval.json and eval.md go, written whole: an earlier evaluate output
            there moves aside to ``OUTPUT_DIR.superseded-N``
            (:func:`~megatron_gamma.rundir.paths.replaced_dir`).
        compare: checkpoint B, evaluated on the same items.
        config, compare_config: config.yaml overriding the config of A / B (default: the
            checkpoint's own, else its run's config.yaml).
        include_path: extra directory of lm-eval task YAML files.
        trust_task_code: let those files run Python code (lm-eval's ``!function`` tag); without
            it such a directory is refused (:func:`~.task_code.check_task_code`).
        num_fewshot: few-shot examples (default: each task's).
        limit: items per task (int) or fraction (float < 1), for quick runs.
        batch_size: lm-eval batch size.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (:func:`lm_eval_device`).
        bootstrap_samples: paired-bootstrap replicates.
        seed: bootstrap seed.

    Returns:
        The eval.json content: {'a', 'b', 'tasks': {task: {'metric', 'higher_is_better', 'n',
        'a'[, 'b', 'diff', 'low', 'high']}}[, 'bootstrap': {'method', 'samples', 'seed',
        'confidence', 'min_items_for_interval'}], 'files'}. 'a' and 'b' are lm-eval's scores;
        'diff' and its interval are over per-item values of a mean-aggregated metric (their mean
        is the score).

    Raises:
        ConfigError: a device lm-eval cannot run on here (:func:`lm_eval_device`), or task files
            of ``include_path`` that would run code without ``trust_task_code``, before any
            task is loaded; an ``output_dir`` that is a file or holds files evaluate does not
            write (:func:`~megatron_gamma.rundir.paths.check_replaced_dir`); an unknown task, a
            group, or with ``compare`` a task without a mean-aggregated metric
            (:func:`_choose_metrics`), before any export.
        DatasetUnavailableError: a dataset that cannot be loaded, before any export.
        ValueError: no tasks or (with ``compare``) bootstrap_samples < 1, before any export.
    """
    device = lm_eval_device(device)
    check_task_code(include_path, trust_task_code)
    check_replaced_dir(output_dir, "evaluate")
    if not tasks:
        raise ValueError("tasks=[]: name at least one lm-eval task. Fix: --tasks hellaswag,...")
    if compare is not None and bootstrap_samples < 1:
        raise ValueError(
            f"bootstrap_samples={bootstrap_samples}: must be >= 1. Fix: e.g. 10000 (the default)"
        )
    from lm_eval.tasks import TaskManager

    # names, datasets and metrics, before any export
    objects = _task_dict(tasks, TaskManager(include_path=include_path))
    metrics = _choose_metrics(objects, tasks, paired=compare is not None)
    os.makedirs(output_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".hf_export.", dir=output_dir)
    try:
        runs = []
        for i, (path, cfg) in enumerate(((ckpt, config), (compare, compare_config))):
            if path is None:
                continue
            exported = export_hf(path, os.path.join(scratch, f"model_{i}"), config=cfg)
            result = run_lm_eval(
                exported["out_dir"],
                tasks,
                metrics,
                include_path=include_path,
                num_fewshot=num_fewshot,
                limit=limit,
                batch_size=batch_size,
                device=device,
            )
            runs.append((exported, result))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (ea, ra), rb = runs[0], runs[1][1] if len(runs) > 1 else None
    report: dict = {
        "a": _label(ea),
        "b": _label(runs[1][0]) if rb is not None else None,
        "tasks": {},
    }
    if rb is not None:
        report["bootstrap"] = {
            "method": "percentile paired bootstrap over items",
            "samples": bootstrap_samples,
            "seed": seed,
            "confidence": _CONFIDENCE,
            "min_items_for_interval": MIN_ITEMS_FOR_INTERVAL,
        }
    for task in tasks:
        entry = {key: ra[task][key] for key in ("metric", "higher_is_better", "n")}
        entry["a"] = ra[task]["score"]
        if rb is not None:
            items_a, items_b = _paired_items(task, ra[task], rb[task])
            stats = paired_bootstrap(
                items_a, items_b, num_samples=bootstrap_samples, confidence=_CONFIDENCE, seed=seed
            )
            entry.update(b=rb[task]["score"], diff=stats["diff"])
            entry.update(low=stats["low"], high=stats["high"])
        report["tasks"][task] = entry
    json_path = os.path.join(output_dir, "eval.json")
    md_path = os.path.join(output_dir, "eval.md")
    report["files"] = {"json": json_path, "markdown": md_path}
    with replaced_dir(output_dir, "evaluate") as tmp:
        _write(os.path.join(tmp, "eval.json"), json.dumps(report, indent=2) + "\n")
        _write(os.path.join(tmp, "eval.md"), _table(report))
    return report

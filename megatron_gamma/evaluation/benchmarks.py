"""``megatron-gamma evaluate CKPT --tasks ...``: lm-evaluation-harness on exported checkpoints.

Each checkpoint is exported with :func:`megatron_gamma.hf.hf_export.export_hf` into a
temporary directory and evaluated by ``lm_eval.simple_evaluate`` (model ``hf``,
``trust_remote_code=True``, fp32) with per-item samples logged. With ``compare``, the second
checkpoint is evaluated on the same tasks and the items both scored are paired: per task, both
scores, A - B and its paired-bootstrap interval (:func:`megatron_gamma.evaluation.bootstrap.
paired_bootstrap`). Writes ``eval.json`` and ``eval.md`` (a markdown table) into ``output_dir``.

Datasets come from wherever lm-eval finds them: the Hugging Face hub, its local cache, or local
files named in a task YAML (``dataset_path: json`` with ``dataset_kwargs.data_files``) under
``include_path``. When a dataset cannot be loaded the error names the task and the dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Optional

import numpy as np

from megatron_gamma.atomic import atomic_write_text
from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.bootstrap import paired_bootstrap
from megatron_gamma.evaluation.errors import DatasetUnavailableError
from megatron_gamma.hf.hf_export import export_hf

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
    """lm-eval's task objects (this downloads or reads the datasets).

    Raises:
        DatasetUnavailableError: a task whose dataset cannot be loaded.
        ConfigError: an unknown task name.
    """
    from lm_eval.tasks import get_task_dict

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
            raise DatasetUnavailableError(
                f"task={task!r}: its dataset {dataset!r} could not be loaded "
                f"({type(e).__name__}: {str(e)[:300]}). Fix: run once with network access so "
                "the Hugging Face cache holds it (HF_HOME), or copy it locally and pass "
                "--include-path DIR with a task YAML using `dataset_path: json` and "
                "`dataset_kwargs: {data_files: {test: /path/to/file.jsonl}}`"
            ) from e
    return out


def _primary_metric(result: dict) -> str:
    """The first reported metric of a task result, e.g. 'acc,none'."""
    for key in result:
        if "," in key and "_stderr" not in key:
            return key
    raise ValueError(f"no metric in lm-eval result {sorted(result)}")


def run_lm_eval(
    model_dir: str,
    tasks: list[str],
    *,
    include_path: Optional[str] = None,
    num_fewshot: Optional[int] = None,
    limit: Optional[float] = None,
    batch_size: int = 1,
    device: str = "cpu",
) -> dict:
    """Evaluate one Hugging Face model directory on lm-eval tasks.

    Returns:
        {task: {'metric': 'acc,none', 'score': float, 'items': {doc_id: per-item score}}}.

    Raises:
        DatasetUnavailableError: a dataset that cannot be loaded.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
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
    report = {}
    for task in tasks:
        result = out["results"][task]
        metric = _primary_metric(result)
        name, filt = metric.split(",", 1)
        items = {
            int(s["doc_id"]): float(s[name])
            for s in out["samples"][task]
            if s.get("filter", filt) == filt
        }
        report[task] = {"metric": metric, "score": float(result[metric]), "items": items}
    return report


def _label(exported: dict) -> str:
    return f"{exported['checkpoint']} (iteration {exported['iteration']})"


def _table(report: dict, labels: tuple[str, Optional[str]]) -> str:
    a, b = labels
    if b is None:
        rows = ["| task | metric | n | score |", "|---|---|---:|---:|"]
        for task, r in report["tasks"].items():
            rows.append(f"| {task} | {r['metric']} | {r['n']} | {r['a']:.4f} |")
        return "\n".join(rows) + "\n"
    rows = [
        f"A = {a}  \nB = {b}\n",
        "| task | metric | n | A | B | A − B | 95% CI (paired bootstrap) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for task, r in report["tasks"].items():
        rows.append(
            f"| {task} | {r['metric']} | {r['n']} | {r['a']:.4f} | {r['b']:.4f} | "
            f"{r['diff']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] |"
        )
    return "\n".join(rows) + "\n"


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
        output_dir: where eval.json and eval.md go (created).
        compare: checkpoint B, evaluated on the same items.
        config, compare_config: config.yaml overriding the config of A / B (default: the
            checkpoint's own, else its run's config.yaml).
        include_path: extra directory of lm-eval task YAML files.
        num_fewshot: few-shot examples (default: each task's).
        limit: items per task (int) or fraction (float < 1), for quick runs.
        batch_size: lm-eval batch size.
        device: 'cpu' or 'cuda'.
        bootstrap_samples: paired-bootstrap replicates.
        seed: bootstrap seed.

    Returns:
        The eval.json content: {'a', 'b', 'tasks': {task: {'metric', 'n', 'a'[, 'b', 'diff',
        'low', 'high']}}, 'files'}.
    """
    if not tasks:
        raise ValueError("tasks=[]: name at least one lm-eval task. Fix: --tasks hellaswag,...")
    from lm_eval.tasks import TaskManager

    _task_dict(tasks, TaskManager(include_path=include_path))  # names and datasets, before exports
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
    for task in tasks:
        items_a = ra[task]["items"]
        entry = {"metric": ra[task]["metric"], "n": len(items_a), "a": ra[task]["score"]}
        if rb is not None:
            common = sorted(set(items_a) & set(rb[task]["items"]))
            stats = paired_bootstrap(
                np.array([items_a[d] for d in common]),
                np.array([rb[task]["items"][d] for d in common]),
                num_samples=bootstrap_samples,
                seed=seed,
            )
            entry.update(n=stats["n"], a=stats["a"], b=stats["b"])
            entry.update(diff=stats["diff"], low=stats["low"], high=stats["high"])
        report["tasks"][task] = entry
    json_path = os.path.join(output_dir, "eval.json")
    md_path = os.path.join(output_dir, "eval.md")
    report["files"] = {"json": json_path, "markdown": md_path}
    _write(json_path, json.dumps(report, indent=2) + "\n")
    _write(md_path, _table(report, (report["a"], report["b"])))
    return report

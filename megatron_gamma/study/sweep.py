"""``megatron-gamma sweep STUDY.yaml --output-dir DIR``: run every (arm, size, seed) of a study.

Steps:

1. **Data** (once): the study's corpus is split by document index into ``DIR/data/train.jsonl``
   and ``DIR/data/heldout.jsonl`` (every ``heldout_every``-th document held out), then each is
   tokenized by ``megatron-gamma preprocess`` into ``DIR/data/{train,heldout}_text_document``
   (resumable; skipped when complete).
2. **Runs**, one after the other: each run directory ``DIR/ARM/SIZE/seed-S/`` gets
   ``study-run.json`` (its identity and resolved config) and ``study-config.yaml``, then a
   subprocess ``python -m megatron_gamma.cli pretrain --config study-config.yaml`` whose
   ``--save`` and ``--load`` are the run's ``checkpoints/``; its console goes to ``pretrain.log``.
   A run whose checkpoint and validation at ``train_iters`` exist is skipped; an interrupted run
   resumes from its newest checkpoint; a run directory whose stored config differs from the
   study's raises :class:`~.spec.StudyChangedError` naming the run and the changed fields.
3. ``--slurm`` writes every run's config and renders one SLURM job array (one task per unfinished
   run, one GPU each) from ``launch/templates/study_array.sbatch.j2``; ``--dry-run`` prints it.

``--dry-run`` (without ``--slurm``) prints the plan: runs, parameters, tokens and an estimated
time on this machine, and writes nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, TextIO

from megatron_gamma.config import changed_fields, redacted_dict, save_config
from megatron_gamma.study import rundir
from megatron_gamma.study.spec import (
    Run,
    Study,
    StudyChangedError,
    StudyError,
    data_prefixes,
    load_study,
    plan,
)

RUN_FILE = "study-run.json"
CONFIG_FILE = "study-config.yaml"
LOG_FILE = "pretrain.log"
MANIFEST = "study.json"
ASSUMED_FLOPS_PER_S = 4e10
"""Training FLOP/s assumed for the time estimate before any run of the study has finished (a
2-core CPU on models of a few million parameters; measured runs replace it)."""
STARTUP_S = 8.0
"""Seconds per run outside the training loop (imports, model build, checkpoint I/O) on CPU."""


@dataclass
class Sizing:
    """Parameters and FLOPs of one run (``megatron_gamma.estimate``, padded vocabulary).

    Attributes:
        params: total parameters.
        non_embedding: parameters outside the embedding and output layer.
        flops: training FLOPs of the whole run (``train_flops_per_token · tokens``).
    """

    params: int
    non_embedding: int
    flops: float


def sizing(run: Run) -> Sizing:
    """Parameter count (estimator) and training FLOPs of a run."""
    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.estimate import count_parameters
    from megatron_gamma.model.flops import train_flops_per_token
    from megatron_gamma.rundir.loader import model_vocab_size

    cfg = run.config
    if os.path.isfile(cfg.data.tokenizer_model):
        vocab = BilingualTokenizer(cfg.data.tokenizer_model).vocab_size
    elif cfg.model.vocab_size:
        vocab = 0
    else:
        raise StudyError(
            f"tokenizer_model={cfg.data.tokenizer_model!r}: not found and no vocab_size. Fix: "
            "give the tokenizer's path, or set vocab_size for a plan without it"
        )
    vocab = model_vocab_size(cfg, vocab)
    counts = count_parameters(cfg, vocab)
    return Sizing(
        counts.total,
        counts.total - counts.embedding,
        train_flops_per_token(cfg, vocab) * run.tokens,
    )


def _fingerprint(run: Run) -> dict:
    return {"arm": run.arm, "size": run.size, "seed": run.seed, "config": redacted_dict(run.config)}


def check_unchanged(run: Run) -> bool:
    """Compare a run directory's stored identity with the study's run.

    Returns:
        True when the directory holds this run already, False when it holds none.

    Raises:
        StudyChangedError: the directory holds the run with other settings.
    """
    path = os.path.join(run.config.logging.run_dir, RUN_FILE)
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    new = json.loads(json.dumps(_fingerprint(run)))
    changed = changed_fields({k: stored.get(k) for k in new}, new)
    diff = [f"{name}: {a!r} -> {b!r}" for name, a, b in changed]
    if diff:
        raise StudyChangedError(
            f"run_dir={run.config.logging.run_dir!r}: the study changed this existing run "
            f"({'; '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}). Fix: restore the study "
            "file, or sweep into a new --output-dir (or delete this run directory to redo it)"
        )
    return True


def write_manifest(study: Study, runs: list[Run], output_dir: str, study_arg: str) -> str:
    """Write ``DIR/study.json``: the study's name, file, baseline, γ grid and every run with
    its arm settings, tokens and parameter counts (what ``report`` reads besides the runs)."""
    entries = []
    for run in runs:
        s = sizing(run)
        m = run.config.model
        entries.append(
            {
                "key": run.key,
                "arm": run.arm,
                "size": run.size,
                "seed": run.seed,
                "train_iters": run.train_iters,
                "tokens": run.tokens,
                "params": s.params,
                "non_embedding": s.non_embedding,
                "init_gamma": run.config.init.init_gamma,
                "norm_epsilon": m.norm_epsilon,
                "gated_attention": m.gated_attention,
                "hidden_size": m.hidden_size,
                "num_layers": m.num_layers,
                "seq_length": m.seq_length,
            }
        )
    manifest = {
        "name": study.name,
        "study": study.path,
        "sweep_command": f"megatron-gamma sweep {study_arg} --output-dir {output_dir}",
        "baseline": study.baseline,
        "gamma_grid": study.gamma_grid,
        "heldout": data_prefixes(output_dir)["heldout"],
        "runs": entries,
    }
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, MANIFEST)
    _write_json(path, manifest)
    return path


def _write_json(path: str, value: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)


def write_run_files(run: Run) -> str:
    """Create the run directory with ``study-run.json`` and ``study-config.yaml``; return the
    config path."""
    run_dir = run.config.logging.run_dir
    os.makedirs(run_dir, exist_ok=True)
    cfg_path = os.path.join(run_dir, CONFIG_FILE)
    save_config(run.config, cfg_path)
    if not os.path.isfile(os.path.join(run_dir, RUN_FILE)):
        _write_json(os.path.join(run_dir, RUN_FILE), _fingerprint(run))
    return cfg_path


def _read_texts(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise StudyError(f"data.inputs={path!r}: line {n} is not JSON ({e})") from e


def prepare_data(study: Study, output_dir: str, out: TextIO) -> dict[str, str]:
    """Split the corpus into train / held-out jsonl and preprocess both (skipped when done).

    Returns:
        {"train": prefix, "heldout": prefix} of the indexed datasets.

    Raises:
        StudyError: unreadable input or a failed ``preprocess``.
    """
    for key, path in [("data.inputs", p) for p in study.data.inputs] + [
        ("data.tokenizer_model", study.data.tokenizer_model)
    ]:
        if not os.path.isfile(path):
            raise StudyError(
                f"{key}={path!r}: file not found. Fix: give paths relative to the study file"
            )
    prefixes = data_prefixes(output_dir)
    data_dir = os.path.dirname(prefixes["train"])
    os.makedirs(data_dir, exist_ok=True)
    split_json = {k: os.path.join(data_dir, f"{k}.jsonl") for k in prefixes}
    if not all(os.path.isfile(p) for p in split_json.values()):
        tmp = {k: p + ".tmp" for k, p in split_json.items()}
        files = {k: open(p, "w", encoding="utf-8") for k, p in tmp.items()}
        counts = {k: 0 for k in files}
        index = 0
        with files["train"], files["heldout"]:
            for path in study.data.inputs:
                for doc in _read_texts(path):
                    split = "heldout" if index % study.data.heldout_every == 0 else "train"
                    files[split].write(json.dumps(doc, ensure_ascii=False) + "\n")
                    counts[split] += 1
                    index += 1
        for k in files:
            os.replace(tmp[k], split_json[k])
        print(f"data: {counts['train']} train, {counts['heldout']} held-out documents", file=out)
    for k, prefix in prefixes.items():
        if os.path.isfile(prefix + ".idx"):
            continue
        cmd = [
            sys.executable, "-m", "megatron_gamma.cli", "preprocess",
            "--input", split_json[k],
            "--tokenizer-model", study.data.tokenizer_model,
            "--output-prefix", os.path.join(data_dir, k),
            "--workers", "1",
        ]  # fmt: skip
        print(f"data: preprocessing {k}: {' '.join(cmd[1:])}", file=out, flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.isfile(prefix + ".idx"):
            raise StudyError(
                f"data={split_json[k]!r}: preprocess failed (exit code {proc.returncode}): "
                f"{proc.stderr.strip()[-800:]}. Fix: check the corpus and tokenizer paths"
            )
    return prefixes


def _measured_rate(runs: list[Run], sizes: dict[str, Sizing]) -> Optional[float]:
    flops = wall = 0.0
    for run in runs:
        path = os.path.join(run.config.logging.run_dir, RUN_FILE)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        if stored.get("wall_seconds") and stored.get("completed_here"):
            flops += sizes[run.key].flops
            wall += max(stored["wall_seconds"] - STARTUP_S, 1.0)
    return flops / wall if wall else None


def describe_plan(study: Study, runs: list[Run]) -> str:
    """The dry-run table: run, parameters, tokens, iterations, estimated minutes, status."""
    sizes = {r.key: sizing(r) for r in runs}
    rate = _measured_rate(runs, sizes)
    basis = (
        f"measured {rate / 1e9:.1f} GFLOP/s from this study's finished runs"
        if rate
        else f"assumed {ASSUMED_FLOPS_PER_S / 1e9:.0f} GFLOP/s"
    )
    rate = rate or ASSUMED_FLOPS_PER_S
    lines = [
        f"study {study.name}: {len(runs)} runs, baseline arm {study.baseline!r}",
        f"{'run':<44} {'params':>11} {'non-emb':>11} {'tokens':>11} {'iters':>6} "
        f"{'est. min':>8}  status",
    ]
    total = 0.0
    for run in runs:
        s = sizes[run.key]
        seconds = STARTUP_S + s.flops / rate
        finished = rundir.is_finished(run.config.logging.run_dir, run.train_iters)
        status = "done" if finished else "to run"
        if not finished:
            total += seconds
        lines.append(
            f"{run.key:<44} {s.params:>11,} {s.non_embedding:>11,} {run.tokens:>11,} "
            f"{run.train_iters:>6} {seconds / 60:>8.1f}  {status}"
        )
    lines.append(
        f"estimated time left on this machine: {total / 60:.1f} min ({basis}, "
        f"{STARTUP_S:.0f} s start-up per run)"
    )
    return "\n".join(lines)


def dry_run(study_path: str, output_dir: str) -> str:
    """The plan of ``sweep --dry-run`` (:func:`describe_plan`); writes nothing.

    Raises:
        StudyError: an invalid study. StudyChangedError: a changed run.
    """
    study = load_study(study_path)
    runs = plan(study, output_dir)
    for run in runs:
        check_unchanged(run)
    return describe_plan(study, runs)


def run_one(run: Run, out: TextIO) -> float:
    """Train one run through ``pretrain`` (resuming from its checkpoints); return wall seconds.

    Raises:
        StudyError: the subprocess failed (names the run and its log).
    """
    cfg_path = write_run_files(run)
    log_path = os.path.join(run.config.logging.run_dir, LOG_FILE)
    cmd = [sys.executable, "-m", "megatron_gamma.cli", "pretrain", "--config", cfg_path]
    start = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.time() - start
    if rc != 0 or not rundir.is_finished(run.config.logging.run_dir, run.train_iters):
        raise StudyError(
            f"run={run.key!r}: pretrain exited with code {rc} before iteration "
            f"{run.train_iters}. Fix: read {log_path}; rerun sweep to resume"
        )
    path = os.path.join(run.config.logging.run_dir, RUN_FILE)
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    stored.update(wall_seconds=wall, completed_here=True)
    _write_json(path, stored)
    return wall


def sweep(study_path: str, output_dir: str, out: TextIO = sys.stdout) -> list[Run]:
    """Run every unfinished run of the study in turn on this machine.

    Returns:
        The plan (every run, finished ones included).

    Raises:
        StudyError: an invalid study, a failed run. StudyChangedError: a changed run.
    """
    study = load_study(study_path)
    runs = plan(study, output_dir)
    for run in runs:
        check_unchanged(run)
    write_manifest(study, runs, output_dir, study_path)
    prepare_data(study, output_dir, out)
    for i, run in enumerate(runs, 1):
        if rundir.is_finished(run.config.logging.run_dir, run.train_iters):
            print(f"[{i}/{len(runs)}] {run.key}: finished, skipped", file=out, flush=True)
            continue
        print(f"[{i}/{len(runs)}] {run.key}: {run.train_iters} iterations", file=out, flush=True)
        wall = run_one(run, out)
        loss = rundir.read_run(run.config.logging.run_dir).final_valid_loss()
        print(
            f"[{i}/{len(runs)}] {run.key}: validation loss {loss:.4f} ({wall:.0f} s)",
            file=out,
            flush=True,
        )
    return runs

"""``megatron-gamma sweep STUDY.yaml --output-dir DIR``: run every run of a study.

Steps:

1. **Data** (once): ``DIR/data/fingerprint.json`` records what the split is made from (each
   input's path, size, mtime and sha256, ``heldout_every``, the tokenizer's sha256); the corpus
   is split by document index into ``DIR/data/train.jsonl`` and ``DIR/data/heldout.jsonl``
   (every ``heldout_every``-th document held out), then each is tokenized by
   ``megatron-gamma preprocess`` into ``DIR/data/{train,heldout}_text_document`` (resumable;
   skipped when complete). A later sweep into ``DIR`` whose data differ from the fingerprint
   raises :class:`~.spec.StudyChangedError` naming what changed.
2. **Runs**, ``--jobs N`` at a time (single-threaded when N > 1), in the order of
   :func:`~.spec.order_key`: each run directory (``DIR/ARM/SIZE/seed-S/`` or
   ``DIR/ARM/SIZE/lr-LR/seed-S/``) gets ``study-run.json`` (its identity and resolved config)
   and ``study-config.yaml``, then a subprocess
   ``python -m megatron_gamma.cli pretrain --config study-config.yaml`` whose ``--save`` and
   ``--load`` are the run's ``checkpoints/``; its console goes to ``pretrain.log``. A run whose
   checkpoint and validation at ``train_iters`` exist is skipped; an interrupted run resumes
   from its newest checkpoint; a run directory whose stored config differs from the study's
   raises :class:`~.spec.StudyChangedError` naming the run and the changed fields (a setting
   only one version of megatron-gamma records is named in a note instead:
   :func:`check_runs_unchanged`). When an
   arm's best LR lands on its grid's edge, the next LR beyond it joins the queue; when the grid
   has settled, its confirm runs do (and ``study.json``).
   A failed run is reported with its log; the others go on, and the sweep fails at the end.
3. ``--slurm`` writes every run's config and renders one SLURM job array (one task per unfinished
   run, one GPU each) from ``launch/templates/study_array.sbatch.j2``; ``--dry-run`` prints it.

``--dry-run`` (without ``--slurm``) prints the plan: runs with their LR and phase, parameters,
tokens, an estimated time on this machine, the confirm runs still pending, and the documents of
each split. It writes nothing, but runs the sweep's checks of its data (:func:`check_data`:
the corpus is read as the split reads it, where no data are prepared yet), so a corpus the
sweep would refuse is refused with the sweep's message.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, TextIO

from megatron_gamma.atomic import LinkedFileError, atomic_open, open_in_place, refuse_link
from megatron_gamma.config import changed_fields, redacted_dict, save_config
from megatron_gamma.data.filters import Filters
from megatron_gamma.data.normalize import remove_control_characters
from megatron_gamma.data.readers import InputError, Record, record_text
from megatron_gamma.rundir.paths import CONFIG, METRICS
from megatron_gamma.study import rundir
from megatron_gamma.study.spec import (
    CONFIRM,
    SHARED,
    Run,
    Study,
    StudyChangedError,
    StudyError,
    data_prefixes,
    grid_runs,
    load_study,
    order_key,
    plan,
)

RUN_FILE = "study-run.json"
CONFIG_FILE = "study-config.yaml"
LOG_FILE = "pretrain.log"
MANIFEST = "study.json"
DATA_FINGERPRINT = "fingerprint.json"
ASSUMED_FLOPS_PER_S = 3.5e10
"""Training FLOP/s assumed for the time estimate before any run of the study has finished: one
CPU core (``OMP_NUM_THREADS=1``) on models of about a million parameters, measured as the CPU
time between a 40- and a 160-iteration run (examples/studies/paper-cpu.yaml's header); measured
runs replace it."""
STARTUP_S = 15.0
"""Seconds per run outside the training loop (imports, model build, evaluation, checkpoint I/O)
on CPU, from the same measurement."""


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
    from megatron_gamma.model.vocab import model_vocab_size

    cfg = run.config
    if os.path.isfile(cfg.data.tokenizer_model):
        vocab = _vocab_size(cfg.data.tokenizer_model, BilingualTokenizer)
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


@functools.lru_cache(maxsize=8)
def _vocab_size(path: str, tokenizer: type) -> int:
    return tokenizer(path).vocab_size


def _fingerprint(run: Run) -> dict:
    return {"arm": run.arm, "size": run.size, "seed": run.seed, "config": redacted_dict(run.config)}


def _one_sided(old: dict, new: dict, at: str = "") -> list[tuple[str, str]]:
    """(dotted name, what) of every entry that only one of two nested dicts holds, descending
    into the dicts both hold: what the other version of megatron-gamma had no setting for."""
    out = []
    for key in sorted(set(old) | set(new)):
        name = f"{at}{key}"
        if key not in old:
            out.append((name, f"{name} (now {new[key]!r})"))
        elif key not in new:
            out.append((name, f"{name} (recorded {old[key]!r}, no longer a setting)"))
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            out += _one_sided(old[key], new[key], f"{name}.")
    return out


def check_unchanged(run: Run) -> list[str]:
    """Compare a run directory's stored identity with the study's run.

    A setting that only one side records (a field added to, or removed from, megatron-gamma
    between the version that recorded the run and this one) cannot be compared: it is returned
    for the caller to report, not refused. Every setting both record must be equal.

    Returns:
        The settings only one side records, each as "name (value)"; [] when every setting was
        compared, or when the directory holds no run yet.

    Raises:
        StudyChangedError: the directory holds the run with other settings.
        StudyError: its ``pretrain.log`` is a symbolic link (the log is appended to in place:
            :func:`~megatron_gamma.atomic.open_in_place`).
    """
    try:
        refuse_link(os.path.join(run.config.logging.run_dir, LOG_FILE))
    except LinkedFileError as e:
        raise StudyError(f"run {run.key}: {e}") from None
    path = os.path.join(run.config.logging.run_dir, RUN_FILE)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    new = json.loads(json.dumps(_fingerprint(run)))
    stored = {k: stored.get(k) for k in new}
    one_sided = _one_sided(stored, new)
    uncompared = {name for name, _ in one_sided}
    changed = [c for c in changed_fields(stored, new) if c[0] not in uncompared]
    diff = [f"{name}: {a!r} -> {b!r}" for name, a, b in changed]
    if diff:
        raise StudyChangedError(
            f"run_dir={run.config.logging.run_dir!r}: the study changed this existing run "
            f"({'; '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}). Fix: restore the study "
            "file, or sweep into a new --output-dir (or delete this run directory to redo it)"
        )
    return [what for _, what in one_sided]


def check_runs_unchanged(runs: list[Run]) -> str:
    """:func:`check_unchanged` on every run: raises at the first changed run; returns a note
    naming the settings some existing runs were recorded without (by an earlier or later
    megatron-gamma), or "" when every setting was compared."""
    uncompared: dict[str, list[str]] = {}
    for run in runs:
        for what in check_unchanged(run):
            uncompared.setdefault(what, []).append(run.key)
    if not uncompared:
        return ""
    keys = sorted({k for ks in uncompared.values() for k in ks})
    named = "; ".join(sorted(uncompared))
    return (
        f"note: {len(keys)} existing run(s) ({keys[0]}{' ...' if len(keys) > 1 else ''}) were "
        f"recorded by a megatron-gamma with other settings, so these were not compared: "
        f"{named}. A finished run is kept as it is; an unfinished one resumes with today's "
        "values. Redo a run by deleting its directory, or sweep into a new --output-dir"
    )


def _shared_lr(runs: list[Run]) -> Optional[float]:
    values = {r.lr for r in runs if r.lr_phase == SHARED}
    return values.pop() if len(values) == 1 else None


def write_manifest(study: Study, runs: list[Run], output_dir: str, study_arg: str) -> str:
    """Write ``DIR/study.json``: the study's name, file, baseline, γ grid, margin, LR selection
    and every run planned so far with its arm settings, LR and phase, tokens and parameter
    counts (what ``report`` reads besides the runs). ``arm_fields`` are the config fields the
    run's arm sets in the study file (the study factors only, :data:`~.spec.ARM_FACTORS`), which
    :meth:`~.analysis.StudyData.matching` checks before it pairs two arms.

    ``shared_lr`` is the shared LR when every size shares it, else None (sizes with their own
    ``lr``: each run's ``lr`` gives it); ``lr_select_seed`` is None without an LR grid. A run's
    ``lr_phase`` is ``shared``, ``grid`` or ``confirm``; a shared run that is also a grid point
    carries ``grid: true``.
    """
    entries = []
    for run in runs:
        s = sizing(run)
        m = run.config.model
        entry = {
            "key": run.key,
            "arm": run.arm,
            "size": run.size,
            "seed": run.seed,
            "lr": run.lr,
            "lr_phase": run.lr_phase,
            "train_iters": run.train_iters,
            "tokens": run.tokens,
            "params": s.params,
            "non_embedding": s.non_embedding,
            "init_gamma": run.config.init.init_gamma,
            "norm_epsilon": m.norm_epsilon,
            "gated_attention": m.gated_attention,
            "arm_fields": dict(study.arms[run.arm].fields),
            "hidden_size": m.hidden_size,
            "num_layers": m.num_layers,
            "seq_length": m.seq_length,
        }
        if run.grid:
            entry["grid"] = True
        entries.append(entry)
    manifest = {
        "name": study.name,
        "study": study.path,
        "sweep_command": shlex.join(
            ["megatron-gamma", "sweep", study_arg, "--output-dir", output_dir]
        ),
        "baseline": study.baseline,
        "gamma_grid": study.gamma_grid,
        "margin": study.margin,
        "shared_lr": _shared_lr(runs),
        "lr_select_seed": study.lr_select_seed,
        "heldout": data_prefixes(output_dir)["heldout"],
        "runs": entries,
    }
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, MANIFEST)
    _write_json(path, manifest)
    return path


def _write_json(path: str, value: dict) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _input_identity(path: str, stored: Optional[dict] = None) -> dict:
    """Path, size, mtime and sha256 of an input; the hash is taken from ``stored`` when size
    and mtime are unchanged (a corpus is hashed once, when its split is prepared)."""
    st = os.stat(path)
    ident = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    same = stored and all(stored.get(k) == v for k, v in ident.items())
    ident["sha256"] = stored["sha256"] if same else _file_sha256(path)
    return ident


def data_fingerprint(study: Study, stored: Optional[dict] = None) -> dict:
    """What the prepared split of ``study`` was made from: every input's identity
    (:func:`_input_identity`), ``heldout_every`` and the tokenizer's sha256
    (:mod:`megatron_gamma.data.tokenizer_fingerprint`).

    Raises:
        StudyError: an input or the tokenizer file is missing.
    """
    from megatron_gamma.data.tokenizer import BilingualTokenizer
    from megatron_gamma.data.tokenizer_fingerprint import fingerprint

    for key, path in [("data.inputs", p) for p in study.data.inputs] + [
        ("data.tokenizer_model", study.data.tokenizer_model)
    ]:
        if not os.path.isfile(path):
            raise StudyError(
                f"{key}={path!r}: file not found. Fix: give paths relative to the study file"
            )
    old = {i.get("path"): i for i in (stored or {}).get("inputs", [])}
    return {
        "inputs": [_input_identity(p, old.get(p)) for p in study.data.inputs],
        "heldout_every": study.data.heldout_every,
        "on_error": study.data.on_error,
        "tokenizer": fingerprint(BilingualTokenizer(study.data.tokenizer_model))["sha256"],
    }


def _data_changes(stored: dict, new: dict) -> list[str]:
    changes = []
    old_paths = [i["path"] for i in stored.get("inputs", [])]
    new_paths = [i["path"] for i in new["inputs"]]
    if old_paths != new_paths:
        changes.append(f"data.inputs: {old_paths} -> {new_paths}")
    else:
        for a, b in zip(stored["inputs"], new["inputs"], strict=True):
            if a.get("sha256") != b["sha256"]:
                changes.append(
                    f"data.inputs {b['path']!r}: content changed (sha256 "
                    f"{str(a.get('sha256'))[:12]} -> {b['sha256'][:12]}, {a.get('size')} -> "
                    f"{b['size']} bytes)"
                )
    if stored.get("heldout_every") != new["heldout_every"]:
        changes.append(
            f"data.heldout_every: {stored.get('heldout_every')} -> {new['heldout_every']}"
        )
    if stored.get("on_error", "stop") != new["on_error"]:  # not recorded before: stop
        changes.append(f"data.on_error: {stored.get('on_error', 'stop')} -> {new['on_error']}")
    if stored.get("tokenizer") != new["tokenizer"]:
        changes.append(
            f"data.tokenizer_model: sha256 {str(stored.get('tokenizer'))[:12]} -> "
            f"{new['tokenizer'][:12]}"
        )
    return changes


def check_data_unchanged(study: Study, output_dir: str) -> Optional[dict]:
    """Compare the fingerprint of ``DIR/data`` (when prepared) with the study's data.

    Returns:
        The study's data fingerprint, or None when ``DIR/data`` holds no prepared dataset yet
        (no ``.idx``, so no run can have trained on it): it does not exist, or an earlier sweep
        stopped before preprocessing finished (trial 13: a corpus with a malformed line pinned
        the directory to that corpus, which no run had used), whatever its fingerprint says.

    Raises:
        StudyChangedError: the prepared data were made from other inputs, another
            ``heldout_every`` or another tokenizer, or without a fingerprint (names what
            changed).
    """
    prefixes = data_prefixes(output_dir)
    data_dir = os.path.dirname(prefixes["train"])
    if not any(os.path.isfile(p + ".idx") for p in prefixes.values()):
        return None
    path = os.path.join(data_dir, DATA_FINGERPRINT)
    fix = (
        "Fix: sweep into a new --output-dir (the data there, and any run that trained on them, "
        "are the old data's), or restore the study's data"
    )
    if not os.path.isfile(path):
        raise StudyChangedError(
            f"output_dir={output_dir!r}: {data_dir} holds data prepared without a fingerprint "
            f"({DATA_FINGERPRINT}), so a changed corpus, split or tokenizer cannot be ruled out. "
            f"{fix}"
        )
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    new = data_fingerprint(study, stored)
    changes = _data_changes(stored, new)
    if changes:
        raise StudyChangedError(
            f"output_dir={output_dir!r}: the study's data changed since {data_dir} was "
            f"prepared ({'; '.join(changes)}). {fix}"
        )
    return new


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


def _read_texts(path: str, on_error: str, skipped: list[str]):
    """(line number, JSON value) of each non-blank line of ``path``; a line that is not JSON
    raises, or with ``on_error`` 'skip' is noted in ``skipped`` as ``PATH:LINE``.

    Raises:
        StudyError: a line that is not JSON, with ``on_error`` 'stop'.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield n, json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    if on_error == "skip":
                        skipped.append(f"{path}:{n}")
                        continue
                    raise StudyError(
                        f"data.inputs={path!r}: line {n} is not JSON ({e}). Fix: one JSON "
                        "object per line (repair or remove that line), or data.on_error: skip "
                        "in the study file to skip and count such lines"
                    ) from e


def _has_no_text(path: str, line: int, doc: object) -> Optional[str]:
    """Why ``preprocess`` (``--json-keys text``, its default filters) writes no document for
    ``doc``, line ``line`` of ``path``: a problem it refuses (its message, up to its Fix), or
    'empty' for a text it drops (the only reason of
    :meth:`~megatron_gamma.data.filters.Filters.text_reason` at the defaults, after
    :func:`~megatron_gamma.data.normalize.remove_control_characters`); None when it keeps the
    document."""
    if not isinstance(doc, dict):
        return f"{path}:{line}: a JSON {type(doc).__name__}, not an object"
    try:
        text = record_text(path, Record(line, doc), "text")
    except InputError as e:
        return str(e).split(". Fix: ")[0]
    return Filters().text_reason(remove_control_characters(text)[0])


def split_corpus(study: Study, files: Optional[dict[str, TextIO]] = None) -> str:
    """Read the study's corpus as the sweep splits it, and check it; with ``files``
    ({"train": f, "heldout": f}) write each JSON value to its split's file, one a line.

    Document ``i`` (every JSON line of ``data.inputs``, in order, counts) is held out when ``i
    % heldout_every == 0``, else trained on. Without ``files`` nothing is written: ``sweep
    --dry-run`` runs the same checks, so it refuses what the sweep would, with its message.

    Returns:
        The line "data: N train, M held-out documents" (with the lines skipped as not JSON).

    Raises:
        StudyError: a line that is not JSON (:func:`_read_texts`), or, with ``data.on_error``
            'stop', a record ``preprocess`` would refuse (not an object, or no string
            ``text``); a split left with no document ``preprocess`` keeps (every record of it
            empty or refused), which ``preprocess`` would refuse to write.
    """
    counts = {"train": 0, "heldout": 0}
    kept = dict(counts)
    index, skipped = 0, []
    for path in study.data.inputs:
        for line, doc in _read_texts(path, study.data.on_error, skipped):
            split = "heldout" if index % study.data.heldout_every == 0 else "train"
            problem = _has_no_text(path, line, doc)
            if problem not in (None, "empty") and study.data.on_error == "stop":
                raise StudyError(
                    f"data.inputs={path!r}: {problem}. Fix: give every record its text as a "
                    "JSON string under 'text' (repair or remove that line), or data.on_error: "
                    "skip in the study file to skip and count such records"
                )
            if files is not None:
                files[split].write(json.dumps(doc, ensure_ascii=False) + "\n")
            counts[split] += 1
            kept[split] += problem is None
            index += 1
    for split, name in (("train", "train"), ("heldout", "held-out")):
        if not kept[split]:
            every = study.data.heldout_every
            raise StudyError(
                f"data.inputs={study.data.inputs}: {kept['train'] + kept['heldout']} document(s) "
                f"with text, none of them in the {name} split (documents 0, {every}, "
                f"{2 * every}, ... are held out, the others train: heldout_every={every}; "
                f"{counts[split]} record(s) in that split, each empty or without a text), so "
                "preprocess would have nothing to write. Fix: give data.inputs more documents "
                "with text" + (", or a smaller data.heldout_every" if split == "heldout" else "")
            )
    n = len(skipped)
    bad = f" ({n} line{'s' if n > 1 else ''} not JSON skipped: {', '.join(skipped[:3])}" + (
        ", ...)" if n > 3 else ")"
    )
    return f"data: {counts['train']} train, {counts['heldout']} held-out documents" + (
        bad if skipped else ""
    )


def check_data(study: Study, output_dir: str) -> str:
    """The sweep's checks of its data before it prepares them, writing nothing (``sweep
    --dry-run``, ``sweep --slurm --dry-run``): prepared data must be unchanged
    (:func:`check_data_unchanged`); where none are prepared yet, the inputs and the tokenizer
    must exist (:func:`data_fingerprint`) and the corpus pass :func:`split_corpus`'s checks.

    Returns:
        The plan's data line.

    Raises:
        StudyChangedError: changed prepared data. StudyError: what :func:`data_fingerprint`
            or :func:`split_corpus` refuses.
    """
    if check_data_unchanged(study, output_dir) is not None:
        return f"data: prepared in {os.path.dirname(data_prefixes(output_dir)['train'])}"
    data_fingerprint(study)
    return split_corpus(study) + " (read from data.inputs, to be prepared by the sweep)"


def prepare_data(study: Study, output_dir: str, out: TextIO) -> dict[str, str]:
    """Split the corpus into train / held-out jsonl and preprocess both (skipped when done).

    Returns:
        {"train": prefix, "heldout": prefix} of the indexed datasets.

    ``DIR/data/fingerprint.json`` (:func:`data_fingerprint`) is written before the split, so
    that every later sweep into ``DIR`` checks the data against it
    (:func:`check_data_unchanged`); where no dataset was prepared yet, it is written anew and a
    split an earlier sweep left is made again.

    Raises:
        StudyError: missing or unreadable input, a failed ``preprocess``.
        StudyChangedError: ``DIR/data`` was prepared from other data.
    """
    new = check_data_unchanged(study, output_dir)
    prefixes = data_prefixes(output_dir)
    data_dir = os.path.dirname(prefixes["train"])
    split_json = {k: os.path.join(data_dir, f"{k}.jsonl") for k in prefixes}
    if new is None:
        fp_path = os.path.join(data_dir, DATA_FINGERPRINT)
        stored = None
        if os.path.isfile(fp_path):
            with open(fp_path, encoding="utf-8") as f:
                stored = json.load(f)
        new = data_fingerprint(study, stored)
        if stored is None or _data_changes(stored, new):
            for stale in split_json.values():  # a split of other data, or of unknown data
                with contextlib.suppress(FileNotFoundError):
                    os.remove(stale)
        os.makedirs(data_dir, exist_ok=True)
        _write_json(fp_path, new)
    if not all(os.path.isfile(p) for p in split_json.values()):
        with contextlib.ExitStack() as stack:
            files = {
                k: stack.enter_context(atomic_open(p, "w", encoding="utf-8"))
                for k, p in split_json.items()
            }
            print(split_corpus(study, files), file=out)
    for k, prefix in prefixes.items():
        if os.path.isfile(prefix + ".idx"):
            continue
        cmd = [
            sys.executable, "-m", "megatron_gamma.cli", "preprocess",
            "--input", split_json[k],
            "--tokenizer-model", study.data.tokenizer_model,
            "--output-prefix", os.path.join(data_dir, k),
            "--workers", "1", "--on-error", study.data.on_error,
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


def pending_runs(study: Study, runs: list[Run]) -> list[tuple[str, Run]]:
    """(key, the shared run it costs as much as) of every confirm run not planned yet."""
    shared = {(r.arm, r.size, r.seed): r for r in runs if r.lr_phase == SHARED}
    return [
        (f"{p.arm}/{p.size}/lr-?/seed-{seed}", shared[(p.arm, p.size, seed)])
        for p in study.pending
        for seed in p.seeds
    ]


def describe_plan(study: Study, runs: list[Run]) -> str:
    """The dry-run table: run, LR and phase, parameters, tokens, iterations, estimated
    minutes, status; confirm runs whose LR the grid has not chosen yet are listed as pending
    and counted in the total (as if the shared LR lost)."""
    sizes = {r.key: sizing(r) for r in runs}
    rate = _measured_rate(runs, sizes)
    basis = (
        f"measured {rate / 1e9:.1f} GFLOP/s from this study's finished runs"
        if rate
        else f"assumed {ASSUMED_FLOPS_PER_S / 1e9:.0f} GFLOP/s"
    )
    rate = rate or ASSUMED_FLOPS_PER_S
    pending = pending_runs(study, runs)
    lines = [
        f"study {study.name}: {len(runs)} runs planned + {len(pending)} pending, baseline arm "
        f"{study.baseline!r}, margin {study.margin:g} nats"
        + (
            f", LR grids on seed {study.lr_select_seed}" if study.lr_select_seed is not None else ""
        ),
        f"{'run':<48} {'lr':>8} {'phase':>7} {'params':>11} {'non-emb':>11} {'tokens':>11} "
        f"{'iters':>6} {'est. min':>8}  status",
    ]
    total, todo = 0.0, 0
    rows = [(r.key, r, r.lr_phase, None) for r in runs]
    rows += [(key, r, CONFIRM, "pending (LR chosen after the grid)") for key, r in pending]
    for key, run, phase, status in rows:
        s = sizes[run.key]
        seconds = STARTUP_S + s.flops / rate
        if status is None:
            finished = rundir.is_finished(run.config.logging.run_dir, run.train_iters)
            status = "done" if finished else "to run"
        if status != "done":
            total += seconds
            todo += 1
        lr = "?" if key != run.key else f"{run.lr:.3g}"
        lines.append(
            f"{key:<48} {lr:>8} {phase + '*' * run.grid:>7} {s.params:>11,} {s.non_embedding:>11,} "
            f"{run.tokens:>11,} {run.train_iters:>6} {seconds / 60:>8.1f}  {status}"
        )
    if any(r.grid for r in runs):
        lines.append("shared* = a shared-LR run that is also a point of its arm's LR grid")
    extend = sum(study.grid_for(p.arm, p.size).extend for p in study.pending)
    confirm = (
        f" ({len(pending)} of them pending confirm runs: none is needed where the shared LR "
        "wins its grid)"
        if any(r.grid for r in runs)
        else ""
    )
    lines.append(
        f"runs left: {todo}{confirm}"
        + (
            f"; up to {extend} more LR-grid runs where a best LR lands on its grid's edge"
            if extend
            else ""
        )
    )
    lines.append(
        f"estimated time left on this machine with its cores free: {total / 60:.1f} min one "
        f"run at a time, {total / 60 / 2:.1f} min with --jobs 2 ({basis}, {STARTUP_S:.0f} s "
        "start-up per run; other load on the machine stretches it)"
    )
    return "\n".join(lines)


def check_study_dir(output_dir: str, jobs: int = 1) -> None:
    """Refuse what ``sweep`` (and its dry run, and ``sweep --slurm``) cannot run in, before the
    study is read: ``jobs`` < 1; an ``output_dir`` that exists and is not a directory; or a
    pretrain run's directory (its ``config.yaml`` or ``metrics.jsonl`` at the top, where a
    study has neither, and no :data:`MANIFEST`): the study's runs, data and manifest would be
    mixed in with its files.

    Raises:
        StudyError: naming the value, what is there, and the fix.
    """
    if jobs < 1:
        raise StudyError(f"jobs={jobs}: must be >= 1. Fix: pass --jobs 1 or more")
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise StudyError(
            f"output_dir={output_dir!r}: exists and is not a directory. Fix: pass a new "
            "--output-dir, or the directory of an earlier sweep of this study"
        )
    held = set(os.listdir(output_dir)) if os.path.isdir(output_dir) else set()
    run = sorted(held & {CONFIG, METRICS})
    if run and MANIFEST not in held:
        raise StudyError(
            f"output_dir={output_dir!r}: holds {' and '.join(run)} and no {MANIFEST}: a pretrain "
            "run's directory, and the sweep would mix its runs with that run's files. Fix: pass "
            "a new --output-dir (or an empty directory)"
        )


def dry_run(study_path: str, output_dir: str, jobs: int = 1) -> str:
    """The plan of ``sweep --dry-run`` (:func:`describe_plan`, then the data line of
    :func:`check_data`); reads the corpus where no data are prepared yet, writes nothing.

    Raises:
        StudyError: ``output_dir`` or ``jobs`` that the sweep itself would refuse
            (:func:`check_study_dir`), an invalid study, or data the sweep would refuse
            (:func:`check_data`: a missing input or tokenizer, a bad line or record, an empty
            split). StudyChangedError: a changed run or changed data.
    """
    check_study_dir(output_dir, jobs)
    study = load_study(study_path)
    runs = plan(study, output_dir)
    note = check_runs_unchanged(runs)
    data = check_data(study, output_dir)
    return describe_plan(study, runs) + f"\n{data}" + (f"\n{note}" if note else "")


@dataclass
class _Running:
    run: Run
    proc: subprocess.Popen
    log: TextIO
    start: float


def _start(run: Run, single_thread: bool) -> _Running:
    """Start ``pretrain`` on one run (resuming from its checkpoints), console to its log."""
    cfg_path = write_run_files(run)
    log_path = os.path.join(run.config.logging.run_dir, LOG_FILE)
    cmd = [sys.executable, "-m", "megatron_gamma.cli", "pretrain", "--config", cfg_path]
    env = dict(os.environ)
    if single_thread:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    log = open(log_path, "a", encoding="utf-8", opener=open_in_place)
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return _Running(run, proc, log, time.time())


def _finish(job: _Running) -> Optional[str]:
    """Record a run that exited: its wall time when it finished, else the failure message."""
    job.log.close()
    wall = time.time() - job.start
    run_dir = job.run.config.logging.run_dir
    if job.proc.returncode != 0 or not rundir.is_finished(run_dir, job.run.train_iters):
        return (
            f"{job.run.key}: pretrain exited with code {job.proc.returncode} before iteration "
            f"{job.run.train_iters}; log: {os.path.join(run_dir, LOG_FILE)}"
        )
    path = os.path.join(run_dir, RUN_FILE)
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    stored.update(wall_seconds=wall, completed_here=True)
    _write_json(path, stored)
    return None


def _newly_planned(study: Study, output_dir: str, known: list[Run]) -> list[Run]:
    """Runs the finished ones now call for: LR-grid extensions (a best LR on its grid's edge)
    and the confirm runs of every pending (arm, size) whose grid has settled."""
    keys = {r.key for r in known}
    new, still = [], []
    for p in study.pending:
        grid, confirm = grid_runs(study, output_dir, p.arm, p.size, rundir.finished_loss)
        new.extend(r for r in grid if r.key not in keys)
        if confirm is None:
            still.append(p)
        else:
            new.extend(confirm)
    study.pending = still
    return new


def sweep(study_path: str, output_dir: str, jobs: int = 1, out: TextIO = sys.stdout) -> list[Run]:
    """Run every unfinished run of the study on this machine, ``jobs`` at a time.

    Runs start in :func:`~.spec.order_key` order (every arm of one (size, seed) together, the
    LR selection seed first). With ``jobs`` > 1 each run is single-threaded
    (``OMP_NUM_THREADS=1``, which sets torch's thread count). When an arm's LR grid at a size
    has finished, its extension (a best LR on the edge) or its confirm runs are planned, queued
    and added to ``study.json``. A failed run is reported with its log and the others go on.

    Returns:
        The plan (every run, finished ones included).

    Raises:
        StudyError: an ``output_dir`` or ``jobs`` it cannot run with (:func:`check_study_dir`),
            an invalid study, or (at the end) the runs that failed, each with its log.
        StudyChangedError: a changed run or changed data.
    """
    check_study_dir(output_dir, jobs)
    study = load_study(study_path)
    runs = plan(study, output_dir)
    note = check_runs_unchanged(runs)
    check_data_unchanged(study, output_dir)
    if note:
        print(note, file=out, flush=True)
    write_manifest(study, runs, output_dir, study_path)
    prepare_data(study, output_dir, out)
    queue, running, failed, done = [], [], [], 0

    def enqueue(new: list[Run]) -> None:
        for run in new:
            if rundir.is_finished(run.config.logging.run_dir, run.train_iters):
                print(f"{run.key}: finished, skipped", file=out, flush=True)
            else:
                queue.append(run)
        queue.sort(key=lambda r: order_key(study, r))

    enqueue(runs)
    while queue or running:
        while queue and len(running) < jobs:
            run = queue.pop(0)
            print(f"{run.key}: {run.train_iters} iterations at lr {run.lr:g}", file=out, flush=True)
            running.append(_start(run, single_thread=jobs > 1))
        time.sleep(0.2)
        for job in [j for j in running if j.proc.poll() is not None]:
            running.remove(job)
            error = _finish(job)
            done += 1
            if error:
                failed.append(error)
                print(f"FAILED {error}", file=out, flush=True)
                continue
            loss = rundir.read_run(job.run.config.logging.run_dir).final_valid_loss()
            print(
                f"{job.run.key}: validation loss {loss:.4f} ({time.time() - job.start:.0f} s)",
                file=out,
                flush=True,
            )
            new = _newly_planned(study, output_dir, runs)
            if note := check_runs_unchanged(new):
                print(note, file=out, flush=True)
            if new:
                runs.extend(new)
                runs.sort(key=lambda r: order_key(study, r))
                write_manifest(study, runs, output_dir, study_path)
                print(
                    f"LR grid: {len(new)} run(s) queued: "
                    + ", ".join(f"{r.key} ({r.lr_phase})" for r in new),
                    file=out,
                    flush=True,
                )
                enqueue(new)
    if failed or study.pending:
        waiting = [f"{p.arm}/{p.size}" for p in study.pending]
        raise StudyError(
            f"runs={len(failed)} failed of {done} started: {'; '.join(failed)}"
            + (f"; confirm runs not planned (grid unfinished): {waiting}" if waiting else "")
            + ". Fix: read the logs; rerun sweep to resume (finished runs are skipped)"
        )
    return runs

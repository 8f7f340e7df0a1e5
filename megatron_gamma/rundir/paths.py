"""The run directory's file names, and the checks of a path a command is given that read no
checkpoint (layout: :mod:`megatron_gamma.rundir`), among them where ``RUN/config.yaml`` records
its checkpoints (:func:`run_save_dir`) and the refusal of a fresh run in another run's directory
(:func:`check_takeover`).

Imports neither torch nor megatron-core (nor anything that does), so that the command line
refuses a mistyped checkpoint, run directory or ``--output-dir``, and ``pretrain`` a run that
would take over another run's directory, at once, before the seconds those imports take
(:mod:`megatron_gamma.cli`: ``evaluate``, ``analyze``, ``pretrain``). :mod:`~megatron_gamma.
rundir.layout` builds on these names.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Optional

import yaml

from megatron_gamma.atomic import (
    atomic_dir,
    atomic_write_text,
    creation_refused,
    missing_dirs,
    move,
)
from megatron_gamma.config import ConfigError
from megatron_gamma.config.loading import CONFIG

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
INIT_AUDIT = "init_audit.json"
"""The start-up init audit's per-parameter table (:mod:`megatron_gamma.training.init_audit`)."""
ANALYSIS = "analysis"
"""``analyze``'s output directory for one run (:mod:`megatron_gamma.diagnostics.analyze`)."""
TRACKER = "latest_checkpointed_iteration.txt"
LAUNCH = "launch.json"
"""The absolute directory ``pretrain`` was launched from, ``{"launch_dir": ...}``, written with
``config.yaml`` at each start (:func:`write_launch_dir`): the relative paths that file records
are read from it (:func:`launch_dirs`)."""

ANALYSIS_FILES = re.compile(
    r"analysis\.json|analysis\.csv|heatmaps\.npz"
    r"|(loss|stable_rank|condensation|attention_sink|norm_saturation|gates|cosine_heatmaps(_.+)?)"
    r"\.png"
)
"""The name of every file ``analyze`` writes (:mod:`megatron_gamma.diagnostics.analyze`), to be
matched whole: an output directory holding only these is an earlier analysis."""

COMPARE_FILES = re.compile(r"compare\.json|delta_sym_by_difficulty\.(csv|png)|tokens\.npz")
"""The name of every file ``compare`` writes (:mod:`megatron_gamma.diagnostics.compare`)."""
EVALUATE_FILES = re.compile(r"eval_loss\.json|eval\.json|eval\.md|\.hf_export\..+")
"""The name of every file ``evaluate`` writes: the held-out loss's ``eval_loss.json``, the
benchmark's ``eval.json`` and ``eval.md`` (:mod:`megatron_gamma.evaluation.benchmarks`), and
the scratch export a killed benchmark left."""
OUTPUT_FILES = {
    "analyze": (ANALYSIS_FILES, "analysis"),
    "compare": (COMPARE_FILES, "comparison"),
    "evaluate": (EVALUATE_FILES, "evaluation"),
}
"""The commands that write an ``--output-dir`` whole (:func:`replaced_dir`): their files, and
what the messages call their output."""

_SAVED_DIR = re.compile(r"^iter_(\d{7})$")  # what checkpoint_dir names


def checkpoint_dir(root: str, iteration: int) -> str:
    """``root/iter_0000010`` for iteration 10."""
    return os.path.join(root, f"iter_{iteration:07d}")


def saved_iterations(root: str) -> list[int]:
    """Iterations of the complete ``iter_N`` directories under ``root``, ascending."""
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for d in os.listdir(root) if (m := _SAVED_DIR.match(d)))


def check_save_dir(save: str | None, load: str | None, overwrite: bool) -> None:
    """Refuse a run without ``load`` whose ``save`` directory already holds checkpoints (an
    earlier run's, or this run's own when it is started again without ``load``): its saves
    would mix with them and its retention would delete them. ``pretrain``
    checks it before torch is imported, and again before anything is built.

    Raises:
        ConfigError: naming the directory, its newest checkpoint and the flags that resolve it.
    """
    if not save or load or overwrite:
        return
    found = saved_iterations(save)
    if found:
        raise ConfigError(
            f"save={save!r}: holds checkpoints (newest iter_{found[-1]:07d}) that this run "
            f"does not load (no --load). Fix: add --load {shlex.quote(save)} to resume from them, "
            "--overwrite to delete them and start afresh, or give another --save"
        )


def missing_checkpoint(ckpt: str, name: str = "checkpoint") -> Optional[str]:
    """The error for a checkpoint path ``ckpt`` that does not exist: the accepted forms, and the
    checkpoints its parent directory holds (a mistyped iteration); None where ``ckpt`` exists.
    ``name``: what gave the path, for the message (``checkpoint``, ``--compare``)."""
    if os.path.exists(ckpt):
        return None
    forms = (
        "a checkpoint (SAVE/iter_NNNNNNN), a checkpoint root (SAVE, for its newest checkpoint) "
        "or a run directory (RUN)"
    )
    parent = os.path.dirname(os.path.normpath(ckpt)) or "."
    saved = [os.path.basename(checkpoint_dir(parent, i)) for i in saved_iterations(parent)]
    if not saved:
        return f"{name}={ckpt!r}: does not exist. Fix: pass {forms}"
    return (
        f"{name}={ckpt!r}: does not exist; {parent} holds {', '.join(saved)}. Fix: pass one "
        f"of those, or {forms}"
    )


def check_output_dir(path: str, name: str) -> None:
    """Refuse ``path`` as a directory a command makes (``os.makedirs``) and writes into, before
    any work: it, or a directory above it, is a file, or the nearest existing one is not
    writable by this user or takes no new entry (``/proc`` even for root, a read-only mount: an
    empty directory of a unique name is made there and removed at once). Nothing is created.

    Args:
        path: the output directory.
        name: what gave it, for the message (``--output-dir``).

    Raises:
        ConfigError: naming ``path``, the file or directory in the way, and the fix.
    """
    missing = missing_dirs(path)
    blocker = next((p for p in missing if os.path.lexists(p)), None)
    if blocker is not None:
        where = "exists and" if blocker == os.path.abspath(path) else f"{blocker!r}"
        raise ConfigError(
            f"{name}={path!r}: {where} is not a directory. Fix: pass {name} a new directory, or "
            "an existing one"
        )
    existing = os.path.dirname(missing[-1]) if missing else os.path.abspath(path)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{name}={path!r}: {existing!r} is not writable by this user. Fix: pass {name} a "
            "directory you can write"
        )
    refused = creation_refused(existing)
    if refused is not None:
        raise ConfigError(
            f"{name}={path!r}: nothing can be created in {existing!r} ({refused}). Fix: pass "
            f"{name} a directory you can write"
        )


def check_new_dir(path: str, name: str, fix: str) -> None:
    """Refuse ``path`` as the directory a command creates and fills whole (``export-hf``'s
    output, ``import-hf``'s run directory): it must not exist or be an empty directory, and the
    directories above it must be makeable and writable (:func:`check_output_dir`).

    Args:
        path: the directory.
        name: what gave it, for the message (``out_dir``, ``run_dir``).
        fix: what to do instead, e.g. 'choose a new directory'.

    Raises:
        ConfigError: ``path`` is a file, a directory that holds anything, or cannot be made;
            naming ``path`` and the fix.
    """
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{name}={path!r}: exists and is not a directory. Fix: {fix}")
    if os.path.isdir(path) and os.listdir(path):
        raise ConfigError(f"{name}={path!r}: exists and is not empty. Fix: {fix}, or remove it")
    check_output_dir(path, name)


def missing_hf_dir(hf_dir: str) -> Optional[str]:
    """The error for a Hugging Face model directory ``hf_dir`` that does not exist or is not a
    directory (``import-hf``), or None."""
    if os.path.isdir(hf_dir):
        return None
    why = "is not a directory" if os.path.exists(hf_dir) else "does not exist"
    return (
        f"hf_dir={hf_dir!r}: {why}. Fix: pass the Hugging Face model directory (config.json, "
        "*.safetensors and tokenizer.json, as `megatron-gamma export-hf` writes it)"
    )


def check_replaced_dir(output_dir: str, command: str) -> None:
    """Refuse an ``output_dir`` that ``command`` (``analyze``, ``compare``, ``evaluate``) would
    not replace whole: a file, or a directory holding anything but an earlier output of that
    command (:data:`OUTPUT_FILES`), which :func:`replaced_dir` moves aside.

    Args:
        output_dir: the ``--output-dir``.
        command: the command that writes it, a key of :data:`OUTPUT_FILES`.

    Raises:
        ConfigError: naming the directory, the files it holds that ``command`` does not write
            (five at most) and the fix.
    """
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(
            f"output_dir={output_dir!r}: exists and is not a directory. Fix: pass a new "
            "--output-dir DIR"
        )
    if not os.path.isdir(output_dir):
        return
    own, noun = OUTPUT_FILES[command]
    foreign = sorted(n for n in os.listdir(output_dir) if not own.fullmatch(n))
    if not foreign:
        return
    more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    if not os.path.isfile(os.path.join(output_dir, CONFIG)):
        fix = "pass a new --output-dir DIR, or move those files out"
    elif command == "analyze":
        fix = "this is a run directory: leave out --output-dir (RUN/analysis) or pass a new one"
    else:
        fix = f"this is a run directory: pass a new --output-dir DIR (e.g. RUN/{command})"
    raise ConfigError(
        f"output_dir={output_dir!r}: holds {', '.join(foreign[:5])}{more}, which {command} "
        f"does not write; it replaces its output directory whole (an earlier {noun} is moved "
        f"aside to DIR.superseded-N), so it will not mix its files with these. Fix: {fix}"
    )


@contextmanager
def replaced_dir(output_dir: str, command: str) -> Iterator[str]:
    """Yield a new empty directory for ``command`` to write its whole output into; when the block
    ends without an error, an earlier output at ``output_dir`` moves aside to
    ``OUTPUT_DIR.superseded-N`` (a line on stdout says so; nothing is deleted) and the new one
    takes its place (:func:`~megatron_gamma.atomic.atomic_dir`). On an error ``output_dir`` is
    left as it was. Callers refuse a foreign ``output_dir`` first (:func:`check_replaced_dir`).
    """
    from megatron_gamma.rundir.layout import superseded_path  # imports torch: at write time

    with atomic_dir(output_dir) as tmp:
        yield tmp
        if os.path.isdir(output_dir) and os.listdir(output_dir):
            aside = superseded_path(output_dir)
            move(output_dir, aside)
            noun = OUTPUT_FILES[command][1]
            print(f"{output_dir}: the earlier {noun} moved to {aside}", flush=True)


def run_labels(run_dirs: Sequence[str]) -> list[str]:
    """A label per run: the fewest trailing components of its path that tell it from every
    other run (``seed-1`` for one run; ``baseline/d64/seed-1`` and ``gamma1/d64/seed-1`` for two
    runs of a study, whose directories all end in ``seed-S``).

    Raises:
        ConfigError: one run directory given twice (the same path or two paths to it).
    """
    real = [os.path.realpath(d) for d in run_dirs]
    for i, path in enumerate(real):
        if path in real[:i]:
            raise ConfigError(
                f"run_dir={run_dirs[i]!r}: the same run as {run_dirs[real.index(path)]!r}, given "
                "twice. Fix: give each run directory once"
            )
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in run_dirs]
    depth = 1
    while len({"/".join(p[-depth:]) for p in parts}) < len(parts):
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def analysis_dir(
    run_dirs: Sequence[str],
    output_dir: Optional[str],
    heatmap_rows: Optional[int] = None,
    condensation_rows: Optional[int] = None,
) -> str:
    """``analyze``'s output directory for ``run_dirs``, after the checks of its arguments that
    read no checkpoint: the row counts, the output directory (:func:`check_replaced_dir`) and
    that the run directories exist.

    Args:
        run_dirs: the run (or ``--save``) directories to analyse.
        output_dir: where to write; None for ``RUN_DIR/analysis`` of a single run.
        heatmap_rows, condensation_rows: rows sampled per heatmap and per condensation score
            (None: ``analyze_run``'s default, not checked).

    Returns:
        ``output_dir``, or its default.

    Raises:
        ConfigError: no run directory, a row count below 2, several runs without
            ``output_dir``, an ``output_dir`` refused by :func:`check_replaced_dir`, a run
            directory that is not a directory or is given twice (:func:`run_labels`); each
            names the value and the fix.
    """
    if not run_dirs:
        raise ConfigError("no run directory given. Fix: megatron-gamma analyze RUN_DIR")
    for flag, rows in (
        ("--heatmap-rows", heatmap_rows),
        ("--condensation-rows", condensation_rows),
    ):
        if rows is not None and rows < 2:
            raise ConfigError(f"{flag} {rows}: need at least 2 rows. Fix: e.g. {flag} 256")
    if output_dir is None:
        if len(run_dirs) > 1:
            raise ConfigError("several runs need --output-dir. Fix: add --output-dir DIR")
        output_dir = os.path.join(run_dirs[0], ANALYSIS)
    check_replaced_dir(output_dir, "analyze")
    for d in run_dirs:
        if not os.path.isdir(d):
            raise ConfigError(f"run_dir={d!r}: not a directory. Fix: pass a run directory")
    run_labels(run_dirs)
    return output_dir


def recorded_save(run_dir: str) -> tuple[Optional[str], Optional[str]]:
    """(``checkpoint.save`` as ``RUN/config.yaml`` records it, that directory resolved as the
    run resolved it): (None, None) without the file or without ``save``.

    ``pretrain`` opens a relative ``save`` (and ``run_dir``) from its working directory: the
    first of :func:`launch_dirs` where the directory exists (the run launched from ``/work``
    with ``--run-dir runs/x --save ckpt/x`` saved into ``/work/ckpt/x``), the first of all when
    none does.

    Raises:
        ConfigError: ``config.yaml`` is not valid YAML, or ``checkpoint.save`` (or the
            ``checkpoint`` section) is not a path, naming the file, the value and the fix.
    """
    config = os.path.join(run_dir, CONFIG)
    if not os.path.isfile(config):
        return None, None
    fix = (
        "Fix: correct it in that file, or pass the checkpoint directory itself "
        "(SAVE or SAVE/iter_NNNNNNN) instead of the run directory"
    )
    try:
        with open(config, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{config}: cannot be read as YAML ({e}). {fix}") from e
    section = raw.get("checkpoint") if isinstance(raw, dict) else None
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"{config}: checkpoint={section!r}: not a mapping of keys. {fix}")
    save = (section or {}).get("save")
    if save is None:
        return None, None
    if not isinstance(save, str) or not save.strip():
        raise ConfigError(f"{config}: checkpoint.save={save!r}: not a directory path. {fix}")
    if os.path.isabs(save):
        return save, save
    candidates = [os.path.normpath(os.path.join(base, save)) for base in launch_dirs(run_dir, raw)]
    return save, next((c for c in candidates if os.path.isdir(c)), candidates[0])


def write_launch_dir(run_dir: str) -> None:
    """Record this process's working directory, the directory the run was launched from, in
    ``RUN/launch.json`` (:data:`LAUNCH`; atomically). ``pretrain`` writes it beside
    ``config.yaml``, whose relative paths (``--run-dir ../w/r1``, ``--save ../w/r1/ckpt``) it
    opened from there, so that the read commands find them from any directory
    (:func:`launch_dirs`)."""
    text = json.dumps({"launch_dir": os.getcwd()}) + "\n"
    atomic_write_text(os.path.join(run_dir, LAUNCH), text)


def recorded_launch_dir(run_dir: str, recorded_run_dir: object) -> Optional[str]:
    """The launch directory ``RUN/launch.json`` records (:func:`write_launch_dir`), where it
    still leads to ``run_dir``: the ``logging.run_dir`` the run's config records
    (``recorded_run_dir``) opened from it is this directory. None without the file, for one
    that cannot be read, and where the run directory was moved or copied since (the recorded
    directory would then resolve the relative paths of another copy, or of nothing)."""
    try:
        with open(os.path.join(run_dir, LAUNCH), encoding="utf-8") as f:
            launch = json.load(f).get("launch_dir")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    if not isinstance(launch, str) or not os.path.isabs(launch):
        return None
    if not isinstance(recorded_run_dir, str) or not recorded_run_dir:
        return None
    opened = os.path.join(launch, recorded_run_dir)  # an absolute run_dir stays itself
    try:
        return launch if os.path.samefile(opened, run_dir) else None
    except OSError:
        return None


def launch_dirs(run_dir: str, raw: Optional[dict]) -> list[str]:
    """The directories the run in ``run_dir`` may have been launched from, the likeliest first:
    where ``pretrain`` resolved the relative paths its config records (``save``, ``data_path``,
    ``tokenizer_model``, ...), since it opens them from its working directory.

    That directory is the one ``RUN/launch.json`` records (:func:`recorded_launch_dir`), where
    it still leads to ``run_dir``; else, for a run written before that file or since moved,
    ``run_dir`` with the relative ``logging.run_dir`` that ``raw`` records taken off its end
    (the run launched from ``/work`` with ``--run-dir runs/x`` lies in ``/work/runs/x``), when
    it ends so (a ``run_dir`` with ``..`` never does); then this process's working directory,
    in any case.

    Args:
        run_dir: where the run directory lies now.
        raw: the run's config as a nested dict (``config.yaml``'s YAML, or the config a
            checkpoint carries); None, or one without ``logging.run_dir``, gives the working
            directory alone.

    Returns:
        Absolute directories, without repeats; the working directory last.
    """
    bases = []
    section = raw.get("logging") if isinstance(raw, dict) else None
    recorded = section.get("run_dir") if isinstance(section, dict) else None
    launch = recorded_launch_dir(run_dir, recorded)
    if launch is not None:
        bases.append(launch)
    elif isinstance(recorded, str) and recorded and not os.path.isabs(recorded):
        parts = os.path.normpath(recorded).split(os.sep)
        here = os.path.abspath(run_dir).split(os.sep)
        if ".." not in parts and here[-len(parts) :] == parts:
            bases.append(os.sep.join(here[: -len(parts)]) or os.sep)
    bases.append(os.getcwd())
    return list(dict.fromkeys(bases))


def run_save_dir(run_dir: str) -> Optional[str]:
    """The checkpoint directory (``save``) that ``RUN/config.yaml`` records, resolved as the
    run resolved it (a relative one from the directory the run was launched from:
    :func:`recorded_save`).

    Args:
        run_dir: a run directory.

    Returns:
        The directory (it may not exist), or None without ``config.yaml`` or without ``save``.

    Raises:
        ConfigError: ``config.yaml`` is not valid YAML, or its ``checkpoint.save`` is not a
            path (names the file, the value and the fix).
    """
    return recorded_save(run_dir)[1]


def _logs_an_iteration(path: str) -> bool:
    """Whether the ``metrics.jsonl`` at ``path`` records a finished iteration: a record whose
    ``iteration`` is not 0. A run writes only iteration-0 records before its first iteration
    ends (the live diagnostics of the initialized model); a line that is not a JSON object with
    an integer ``iteration`` (a torn or hand-edited line) counts as one, so that a file this
    cannot read is never taken for a run that trained nothing."""
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return True
            iteration = record.get("iteration") if isinstance(record, dict) else None
            if type(iteration) is not int or iteration != 0:
                return True
    return False


def check_takeover(run_dir: str, load: Optional[str]) -> Optional[str]:
    """Refuse a run that would take over ``run_dir`` from an earlier run (another one, or this
    one started again without ``load``): the directory already
    holds a run's ``config.yaml`` and records of what it trained (an iteration in
    ``metrics.jsonl``, or checkpoints in ``RUN/checkpoints`` or in the ``save`` that
    ``config.yaml`` records: :func:`run_save_dir`), and this run does not continue it, i.e.
    ``load`` is neither that ``save`` nor ``RUN/checkpoints``. Its config.yaml would no longer
    describe that run's checkpoints, and its curves would end. ``--overwrite`` skips this check
    (the caller's choice).

    A run directory whose run never finished an iteration (it stopped at its first step: no
    checkpoint, nothing in ``metrics.jsonl`` past iteration 0) holds nothing that was trained:
    this run may take it over, and the line returned says so. The new run rewrites
    ``config.yaml`` (atomically) and moves the earlier run's records aside to
    ``*.superseded-N`` as any fresh start does (``metrics.jsonl``, ``tensorboard/``,
    ``init_audit.json``); nothing is deleted.

    Args:
        run_dir: the run directory this run writes.
        load: this run's ``--load`` (None: a fresh start).

    Returns:
        None where ``run_dir`` holds no ``config.yaml``, or where this run continues the run
        there; else the line saying that this run takes over the directory of a run that never
        finished an iteration.

    Raises:
        ConfigError: naming the directory, the earlier run's records and the fixes
            (``--run-dir NEW_DIR``, ``--load SAVE``, ``--overwrite``); a ``config.yaml`` whose
            ``save`` is unreadable (:func:`run_save_dir`).
    """
    config = os.path.join(run_dir, CONFIG)
    if not os.path.isfile(config):
        return None
    records = [METRICS] if _logs_an_iteration(os.path.join(run_dir, METRICS)) else []
    save = run_save_dir(run_dir)
    own = os.path.join(run_dir, CHECKPOINTS)
    roots = {os.path.realpath(p): p for p in (own, save) if p is not None}
    for root in roots.values():
        if saved_iterations(root):
            shown = os.path.relpath(root, run_dir)
            shown = root if shown.startswith(os.pardir) else shown
            records.append(os.path.join(shown, f"iter_{saved_iterations(root)[-1]:07d}"))
    if load is not None and os.path.realpath(load) in roots:
        return None
    if not records:
        return (
            f"run_dir={run_dir!r}: held a run that never finished an iteration ({CONFIG}; no "
            f"checkpoint, no iteration in {METRICS}); this run takes the directory over: it "
            f"rewrites {CONFIG} and moves the earlier run's records aside to *.superseded-N"
        )
    resume = f"add --load {shlex.quote(save)} to resume it, " if save is not None else ""
    raise ConfigError(
        f"run_dir={run_dir!r}: holds the records of a run ({CONFIG}, {' and '.join(records)}) "
        f"that this run does not continue ("
        + (f"load={load!r} is elsewhere" if load is not None else "no --load")
        + f"); starting here would replace "
        f"its {CONFIG}. Fix: give this run its own --run-dir NEW_DIR, {resume}or add "
        f"--overwrite to start afresh here (its {METRICS}, tensorboard/, {INIT_AUDIT} and "
        f"{ANALYSIS}/ are moved aside to *.superseded-N)"
    )

"""Files of a run directory and of its checkpoints (layout: :mod:`megatron_gamma.rundir`; their
names, and the checks that read no checkpoint, in :mod:`~megatron_gamma.rundir.paths`).

Every read of a checkpoint's files goes through :func:`read_common` (the common state, no
tensor), :func:`read_tensors_metadata` (global shapes) and :func:`read_state` (sharded tensors
and objects), through :mod:`megatron_gamma.checkpoint_trust`'s restricted readers: megatron-core
``dist_checkpointing`` is called nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
from typing import Optional

import torch.distributed as dist
import yaml

from megatron_gamma import checkpoint_trust
from megatron_gamma.atomic import atomic_write_text, move
from megatron_gamma.config import Config, ConfigError, redacted_dict
from megatron_gamma.rundir.paths import (
    ANALYSIS,
    CHECKPOINTS,
    CONFIG,
    INIT_AUDIT,
    METRICS,
    TRACKER,
    checkpoint_dir,
    recorded_save,
    run_save_dir,
    saved_iterations,
)

RUN_CONFIG_KEY = "run_config"
"""Common-state key of the resolved config (``config.yaml``'s text: ``cluster.env`` values
redacted, :func:`~megatron_gamma.config.redacted_dict`)."""
TOKENIZER_KEY = "tokenizer_fingerprint"
"""Common-state key of the tokenizer fingerprint
(:func:`megatron_gamma.data.tokenizer_fingerprint.fingerprint`)."""

_ITER_DIR = re.compile(r"^iter_(\d+)$")  # any iter_N a user may point at
_log = logging.getLogger(__name__)


def latest_iteration(root: str) -> int | None:
    """Newest complete checkpoint under ``root``: the tracker, else the highest ``iter_N``.

    Raises:
        CheckpointError: the tracker holds no iteration number (empty or torn), or names an
            iteration with no ``iter_N`` directory (a stale or hand-edited tracker; Megatron-LM
            stops on it too), naming it, the iterations that exist and the fix.
    """
    tracker = os.path.join(root, TRACKER)
    found = saved_iterations(root)
    if os.path.isfile(tracker):
        with open(tracker) as f:
            text = f.read().strip()
        if not text.isdigit():
            newest = f"the newest iter_N here is {found[-1]}" if found else "no iter_N is here"
            raise checkpoint_trust.CheckpointError(
                f"{tracker}: holds {text!r}, not an iteration number (empty or torn: a write "
                f"that did not finish). Fix: write the iteration to resume from into it "
                f"({newest}), or delete it to resume from the newest iter_N"
            )
        it = int(text)
        if os.path.isdir(checkpoint_dir(root, it)):
            return it
        here = (
            f"the iterations here are {', '.join(map(str, found))}"
            if found
            else "no iter_N is here"
        )
        raise checkpoint_trust.CheckpointError(
            f"{tracker}: names iteration {it}, but {checkpoint_dir(root, it)} does not exist "
            f"({here}; a stale or hand-edited tracker, e.g. a rollback to a deleted "
            "checkpoint). Fix: write the iteration to resume from into it, or delete it to "
            "resume from the newest iter_N"
        )
    return found[-1] if found else None


def is_checkpoint(path: str) -> bool:
    """True for one complete dist_checkpointing directory (``.../iter_N`` with metadata)."""
    return os.path.isfile(os.path.join(path, "metadata.json"))


def read_common(path: str) -> dict:
    """The common (non-sharded) state of checkpoint ``path``: iteration, scheduler, layout, the
    run's description (:func:`describe`), ... No tensor is read."""
    return checkpoint_trust.load_common_state_dict(path)


def read_tensors_metadata(path: str) -> dict:
    """{key: ShardedTensor with the global shape} of checkpoint ``path``; no tensor is read."""
    return checkpoint_trust.load_tensors_metadata(path)


NOT_LOADED_OPTIMIZER = "optimizer."
"""Prefix of the checkpoint keys of the optimizer state (megatron-core's sharded keys)."""
_CHAINED_OPTIMIZER = re.compile(r"^chained_\d+\.optimizer\.")
"""Checkpoint keys of a megatron-core ``ChainedOptimizer``'s state (``chained_0.optimizer.*``):
an MoE run under expert_model_parallel_size > 1 has one optimizer for the dense and one for the
expert parameters."""
NOT_LOADED_RNG = "rng_state"
"""Checkpoint key of the per-rank RNG states."""
_SHOWN_KEYS = 8


def _keys_text(keys: list[str]) -> str:
    """``'3: a, b, c'``, at most :data:`_SHOWN_KEYS` keys named."""
    more = ", ..." * (len(keys) > _SHOWN_KEYS)
    return f"{len(keys)}: {', '.join(keys[:_SHOWN_KEYS])}{more}"


def _shape(tensor) -> str:
    """``'4x512x64'``: a sharded tensor's global shape."""
    return "x".join(map(str, tensor.global_shape))


def check_loadable(sharded: dict, path: str, changed: tuple[str, ...] = ()) -> None:
    """Stop, before any tensor is read, a load of checkpoint ``path`` into the sharded state dict
    ``sharded`` that no ``--dist-ckpt-strictness`` could complete: keys ``sharded`` asks for and
    the checkpoint lacks (megatron-core's "unexpected" keys, found as its ``load`` finds them:
    its ``load_preprocess`` and ``validate_integrity_and_strict_load``), or tensors whose global
    shape differs from the checkpoint's (the check of megatron-core's torch_dist load planner,
    less the tensors it lets differ, ``allow_shape_mismatch``). Both come from the checkpoint's
    metadata alone; ``sharded`` is not changed. Collective when torch.distributed is
    initialized: every rank raises the same error, naming what any rank found. ``changed``:
    the model settings this run changed from the checkpoint's run (:func:`section_changes`),
    named in the fix of a refusal over tensors of other shapes.

    Raises:
        ConfigError: such keys or shapes, named (at most :data:`_SHOWN_KEYS` of each), with the
            fix: the model as the checkpoint was built, or ``--no-load-optim`` where only the
            optimizer's keys are absent (for a change of the expert-parallel layout of the
            optimizer state, that and the saved ``--expert-model-parallel-size``:
            :func:`expert_layout_change`).
        CheckpointError: ``path``'s metadata is refused (:func:`checkpoint_trust.read_metadata`).
    """
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.state_dict_utils import load_preprocess
    from megatron.core.dist_checkpointing.utils import extract_sharded_base
    from megatron.core.dist_checkpointing.validation import (
        StrictHandling,
        validate_integrity_and_strict_load,
    )

    held = checkpoint_trust.load_sharded_metadata(path)
    asked, _, _ = load_preprocess(sharded)
    asked, _ = extract_sharded_base(asked)
    _, _, absent = validate_integrity_and_strict_load(
        asked,
        StrictHandling.RETURN_UNEXPECTED,
        validate_access_integrity=False,
        ckpt_sharded_metadata=held,
    )
    shapes = {
        f"{t.key}: checkpoint {_shape(held[t.key])}, this run {_shape(t)}"
        for t in nested_values(asked)
        if isinstance(t, ShardedTensor)
        and not t.allow_shape_mismatch
        and isinstance(held.get(t.key), ShardedTensor)
        and tuple(held[t.key].global_shape) != tuple(t.global_shape)
    }
    if dist.is_initialized() and dist.get_world_size() > 1:
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, (sorted(absent), sorted(shapes)))
        absent = set().union(*(a for a, _ in every))
        shapes = set().union(*(sh for _, sh in every))
    absent, shapes = sorted(absent), sorted(shapes)
    if not absent and not shapes:
        return
    found = []
    if absent:
        found.append(f"it lacks keys this run asks for ({_keys_text(absent)})")
    if shapes:
        found.append(f"it holds tensors of other shapes ({_keys_text(shapes)})")
    optimizer_only = all(
        k.startswith(NOT_LOADED_OPTIMIZER) or _CHAINED_OPTIMIZER.match(k) for k in absent
    )
    layout_change = (
        None if shapes or not optimizer_only else expert_layout_change(absent, held, path)
    )
    if layout_change:
        raise ConfigError(f"{path} cannot be loaded into this run: {found[0]}. {layout_change}")
    if not shapes and optimizer_only:
        what, fix = "optimizer", "--no-load-optim to start the optimizer afresh"
    elif changed:
        what = "model"
        fix = (
            f"build the model as the checkpoint was: this run changed {', '.join(changed)}; drop "
            "those flags to resume the run as it was built"
        )
    else:
        what = "model"
        fix = (
            "build the model as the checkpoint was (its run's config.yaml: e.g. --hidden-size, "
            "--num-layers, --ffn-hidden-size, --gated-attention)"
        )
    raise ConfigError(
        f"{path} cannot be loaded into this run: {'; '.join(found)}. It was saved from another "
        f"{what}, and no --dist-ckpt-strictness loads it, since the model and optimizer are "
        f"loaded strictly. Fix: {fix}, or another checkpoint"
    )


def expert_layout_change(absent: list[str], held, path: str) -> Optional[str]:
    """Why a resume lacks the optimizer keys ``absent`` of checkpoint ``path``, where the
    expert-parallel layout changed, with the fix; None otherwise. Under
    expert_model_parallel_size > 1 an MoE run's optimizer is megatron-core's
    ``ChainedOptimizer`` (its state keyed ``chained_N.optimizer.*``), otherwise one optimizer
    (``optimizer.*``), so that the optimizer state of one layout cannot resume the other, though
    both are the same optimizer. The checkpoint's expert_model_parallel_size is named from its
    config (:func:`saved_description`) where it records one.

    Args:
        absent: keys this run asks for and ``path`` lacks, all the optimizer's.
        held: the keys ``path`` holds (its sharded metadata).
        path: the checkpoint.
    """
    asked_chained = any(_CHAINED_OPTIMIZER.match(k) for k in absent)
    held_chained = any(_CHAINED_OPTIMIZER.match(k) for k in held)
    if asked_chained == held_chained:
        return None
    try:
        saved = saved_description(path)[0] or {}
    except ConfigError:
        saved = {}
    ep = (saved.get("parallel") or {}).get("expert_model_parallel_size")
    if held_chained:
        was = f"expert_model_parallel_size={ep}" if ep else "expert_model_parallel_size > 1"
        how = (
            f"a ChainedOptimizer's (chained_N.optimizer.*: {was}, one optimizer for the dense "
            "and one for the expert parameters), and this run, under expert_model_parallel_size"
            "=1, asks for a single optimizer's (optimizer.*)"
        )
        same = (
            f"--expert-model-parallel-size {ep}, as it was saved"
            if ep
            else ("the --expert-model-parallel-size it was saved with (> 1)")
        )
    else:
        was = f"expert_model_parallel_size={ep}" if ep else "expert_model_parallel_size=1"
        how = (
            f"a single optimizer's (optimizer.*: {was}), and this run, under "
            "expert_model_parallel_size > 1, asks for a ChainedOptimizer's "
            "(chained_N.optimizer.*: one optimizer for the dense and one for the expert "
            "parameters)"
        )
        same = f"--expert-model-parallel-size {ep or 1}, as it was saved"
    return (
        "Its optimizer state was saved under another expert-parallel layout: the checkpoint "
        f"holds {how}; no --dist-ckpt-strictness converts one into the other. "
        + optimizer_layout_fix(same)
    )


def optimizer_layout_fix(same: str) -> str:
    """The fix of a resume whose optimizer state was saved under another layout than this run
    asks for, one megatron-core cannot convert (the expert-parallel layout:
    :func:`expert_layout_change`; the distributed optimizer's:
    :func:`megatron_gamma.training.checkpointing.load_checkpoint`): resume with the flag
    ``same`` as it was saved, or load the weights alone with ``--no-load-optim``.

    Args:
        same: the setting the checkpoint was saved with, as the flag that gives it
            (``--expert-model-parallel-size 2, as it was saved``).

    Returns:
        ``Fix: resume with SAME, or add --no-load-optim ...``, one sentence.
    """
    return (
        f"Fix: resume with {same}, or add --no-load-optim to start the optimizer afresh (the "
        "model weights load into any layout), or another checkpoint"
    )


def read_state(
    sharded: dict,
    path: str,
    strict: str,
    not_loaded: tuple[str, ...] = (),
    fix: Optional[str] = None,
    changed: tuple[str, ...] = (),
) -> dict:
    """Load checkpoint ``path`` into the sharded state dict ``sharded`` (megatron-core
    ``dist_checkpointing.load``: resharded to this process's layout); returns the loaded dict
    with the common state merged in.

    Keys this run asks for and the checkpoint lacks, and tensors of other shapes, stop the load
    before anything is read, whatever ``strict`` is (:func:`check_loadable`): the model and
    optimizer are then loaded strictly, so no strictness could load it, and megatron-core would
    otherwise stop inside torch's reader, its load planner or the model's ``load_state_dict``.
    Keys only the checkpoint holds are handled as ``strict`` says (``--dist-ckpt-strictness``;
    :class:`~megatron_gamma.config.choices.DistCkptStrictness`). For ``log_all`` and
    ``raise_all`` they are reported here rather than by megatron-core, less those the caller
    leaves unread on purpose (``not_loaded``: key prefixes, e.g. :data:`NOT_LOADED_OPTIMIZER`
    for a weights-only load), which megatron-core would report on every such load; ``raise_all``
    stops once the checkpoint is read, since megatron-core's own check, which stops before,
    cannot leave them out. ``fix``: the fix ``raise_all``'s refusal names, for a caller that
    has no ``--dist-ckpt-strictness`` (a read of the weights alone: ``evaluate``, ...).

    Raises:
        ConfigError: keys this run asks for and the checkpoint lacks, or tensors of other
            shapes; with ``raise_all``, keys the checkpoint holds and the load does not take;
            named with the fix.
        CheckpointError: the checkpoint's files are refused (:mod:`checkpoint_trust`).
    """
    check_loadable(sharded, path, changed)
    if strict not in ("log_all", "raise_all"):
        return checkpoint_trust.load(sharded, path, strict)
    state, extra, _ = checkpoint_trust.load(sharded, path, "return_all")
    # a ChainedOptimizer's state (expert parallelism) is the optimizer's too: chained_N.optimizer.
    extra = sorted(
        k
        for k in extra
        if not _CHAINED_OPTIMIZER.sub(NOT_LOADED_OPTIMIZER, k).startswith(not_loaded)
    )
    if not extra:
        return state
    what = f"held by the checkpoint and not taken by this run's model ({_keys_text(extra)})"
    if strict == "raise_all" and fix is not None:
        raise ConfigError(
            f"{path} holds weights the model built from this config does not take "
            f"({_keys_text(extra)}): without them it is another model than the checkpoint's. "
            f"Fix: {fix}"
        )
    if strict == "raise_all":
        raise ConfigError(
            f"dist_ckpt_strictness='raise_all': {path} holds keys {what}. Fix: build the model "
            "as the checkpoint was (its run's config.yaml), or --dist-ckpt-strictness log_all to "
            "load it without them"
        )
    if not (dist.is_initialized() and dist.get_rank()):
        _log.warning("dist_ckpt_strictness='log_all': %s holds keys %s", path, what)
    return state


def checkpoint_iteration(path: str) -> int:
    """Iteration of a checkpoint directory: its ``iter_N`` name, else the saved ``iteration``."""
    m = _ITER_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else int(read_common(path)["iteration"])


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """Complete checkpoints under ``root`` as (iteration, directory), oldest first.

    ``root`` may be one checkpoint, a checkpoint root (with ``iter_N`` directories) or a run
    directory: its checkpoints are looked for in ``RUN/checkpoints``, then where its
    ``config.yaml`` records ``save`` (:func:`run_save_dir`). ``.partial`` saves are ignored.

    Raises:
        ConfigError: ``root`` is a run directory whose ``config.yaml`` is unreadable or records
            a ``save`` that is not a path, or whose recorded ``save`` does not exist while no
            other place holds a checkpoint (:func:`run_save_dir`; names the file, the value and
            the fix).
    """
    if is_checkpoint(root):
        return [(checkpoint_iteration(root), root)]
    for base in _checkpoint_roots(root):
        if not os.path.isdir(base):
            continue
        found = []
        for name in os.listdir(base):
            path = os.path.join(base, name)
            m = _ITER_DIR.match(name)
            if m and is_checkpoint(path):
                found.append((int(m.group(1)), path))
        if found:
            return sorted(found)
    _check_recorded_save(root)
    return []


def resolve_checkpoint(path: str) -> str:
    """One checkpoint directory from a checkpoint, a checkpoint root or a run directory (the
    newest complete checkpoint, per Megatron's tracker file). A run directory's checkpoints are
    looked for in ``RUN/checkpoints``, then where its ``config.yaml`` records ``save``
    (:func:`run_save_dir`).

    Raises:
        ConfigError: nothing that looks like a checkpoint at ``path``; a run directory whose
            ``config.yaml`` is unreadable, records a ``save`` that is not a path, or records
            one that does not exist (names the file, the value and the fix).
    """
    if is_checkpoint(path):
        return path
    for base in _checkpoint_roots(path):
        if os.path.isdir(base):
            it = latest_iteration(base)
            if it is not None and is_checkpoint(checkpoint_dir(base, it)):
                return checkpoint_dir(base, it)
    _check_recorded_save(path)
    raise ConfigError(
        f"checkpoint={path!r}: no complete checkpoint found. Fix: pass SAVE/iter_NNNNNNN, a "
        "checkpoint directory with latest_checkpointed_iteration.txt, or a run directory"
    )


def _checkpoint_roots(path: str) -> list[str]:
    """Where the checkpoints of ``path`` may lie, in order: ``path`` itself (a checkpoint root),
    ``path/checkpoints`` (a run directory's own: a copied or moved run directory reads the
    checkpoints it holds, not those at the path its ``config.yaml`` records), then the ``save``
    its ``config.yaml`` records."""
    roots = [path, os.path.join(path, CHECKPOINTS)]
    save = run_save_dir(path)
    if save is not None:
        roots.append(save)
    return list(dict.fromkeys(os.path.normpath(r) for r in roots))


def _check_recorded_save(run_dir: str) -> None:
    """Raise when ``RUN/config.yaml`` records a ``save`` that does not exist (and so could not
    be searched): the run directory was moved, or the run was launched from elsewhere."""
    value, save = recorded_save(run_dir)
    if save is not None and not os.path.isdir(save):
        raise ConfigError(
            f"{os.path.join(run_dir, CONFIG)}: checkpoint.save={value!r}: no such directory "
            f"({save!r}), and {os.path.join(run_dir, CHECKPOINTS)!r} holds no checkpoint. "
            "Fix: pass the checkpoint directory itself (SAVE or SAVE/iter_NNNNNNN), or run "
            "this command from the directory the run was launched from"
        )


def find_run_config(path: str) -> Optional[str]:
    """``config.yaml`` of the run that wrote ``path``: in ``path`` or up to three levels up
    (``RUN/checkpoints/iter_N``); None when there is none."""
    here = os.path.abspath(path)
    for _ in range(4):
        candidate = os.path.join(here, CONFIG)
        if os.path.isfile(candidate):
            return candidate
        here = os.path.dirname(here)
    return None


def describe(cfg: Config, tokenizer_fingerprint: Optional[dict]) -> dict:
    """The common-state entries that make a checkpoint self-describing: the resolved config as
    YAML text (``config.yaml``'s content, ``cluster.env`` values redacted; plain text, so reading
    it unpickles no object) and the tokenizer fingerprint (None when unknown)."""
    text = yaml.safe_dump(redacted_dict(cfg), sort_keys=False, allow_unicode=True)
    return {RUN_CONFIG_KEY: text, TOKENIZER_KEY: tokenizer_fingerprint}


def description(common: dict) -> tuple[Optional[dict], Optional[dict]]:
    """(the config as a nested dict, the tokenizer fingerprint) that a checkpoint whose common
    state is ``common`` (:func:`read_common`) carries (:func:`describe`); (None, None) for a
    checkpoint written before checkpoints carried them."""
    text = common.get(RUN_CONFIG_KEY)
    return (yaml.safe_load(text) if text else None), common.get(TOKENIZER_KEY)


def saved_description(path: str) -> tuple[Optional[dict], Optional[dict]]:
    """:func:`description` of checkpoint ``path`` (its common state read here)."""
    return description(read_common(path))


def section_changes(
    cfg: Config, saved: Optional[dict], section: str, ignore: tuple[str, ...] = ()
) -> list[str]:
    """Each setting of config section ``section`` (``"model"``, ``"init"``) whose value in
    ``cfg`` differs from the one the checkpoint's run recorded (``saved``:
    :func:`description`), as ``key=now (the run had then)``, sorted by key; keys in
    ``ignore`` and keys an older version did not record are left out. Empty when ``saved``
    is None or holds no such section (a checkpoint written before checkpoints carried
    their config)."""
    if not saved or not isinstance(saved.get(section), dict):
        return []
    then = saved[section]
    now = yaml.safe_load(yaml.safe_dump(redacted_dict(cfg)))[section]
    return [
        f"{key}={now[key]!r} (the run had {then[key]!r})"
        for key in sorted(now)
        if key not in ignore and key in then and then[key] != now[key]
    ]


def check_resume_init(cfg: Config, saved: Optional[dict], load: str) -> None:
    """Refuse a resume whose ``init`` settings differ from those the checkpoint's run recorded
    (:func:`saved_description`; ``init_audit`` aside, a reporting choice, and settings a
    checkpoint of an older version did not record). A resume continues
    the checkpoint's weights, so a changed initialization setting would act on nothing, yet
    ``config.yaml`` and the study report would then describe a run that was never trained.

    Raises:
        ConfigError: naming each changed setting with both values, and the fix.
    """
    changed = section_changes(cfg, saved, "init", ignore=("init_audit",))
    if changed:
        raise ConfigError(
            f"load={load!r}: resuming with other initialization settings: {', '.join(changed)}; "
            "a resume continues the checkpoint's weights, so they would change nothing but "
            f"{CONFIG} and the report, which would then describe another run. Fix: drop those "
            "flags to resume as the run was started, or start a new run (--finetune to take "
            "the weights, with its own --run-dir and --save)"
        )


def seq_length_warning(cfg: Config, saved: Optional[dict]) -> Optional[str]:
    """The warning for a resume at another ``--seq-length`` than the checkpoint's run
    (``saved``: :func:`description`), or None. The run's data position (consumed samples)
    counts samples of the old length, while the resumed run builds its sample index at the new
    one, so it does not continue where the run stopped in the data; Megatron-LM allows it too,
    so it is a warning, not a refusal."""
    then = (saved or {}).get("model", {}).get("seq_length")
    now = cfg.model.seq_length
    if then is None or then == now:
        return None
    return (
        f"WARNING: seq_length={now} (the run had {then}): the resumed run's data position "
        f"counts {then}-token samples, while its sample index is built of {now}-token ones, so "
        "it does not continue where the run stopped in the data. Fix: resume with "
        f"--seq-length {then}, or start a run of its own from these weights (--finetune, its "
        "own --run-dir and --save) to train at the new length"
    )


def superseded_path(path: str) -> str:
    """Where to set ``path`` aside, beside it, under the first free number N from 1:
    ``STEM.superseded-N.EXT`` for a file (``metrics.superseded-1.jsonl``),
    ``PATH.superseded-N`` for a directory (``tensorboard.superseded-1``)."""
    base = os.path.normpath(path)
    stem, ext = (base, "") if os.path.isdir(base) else os.path.splitext(base)
    n = 1
    while os.path.lexists(aside := f"{stem}.superseded-{n}{ext}"):
        n += 1
    return aside


SUPERSEDED = re.compile(r"\.superseded-(\d+)(\.[^.]+)?$")
"""A name :func:`superseded_path` gave; group 1 is N."""


def superseded_note(run_dir: str) -> str | None:
    """A line saying that ``run_dir`` holds records of earlier runs set aside
    (``*.superseded-N*``), by how many starts at least (the highest N), their size in all, and
    the command that deletes them, which nothing here runs; None when it holds none.

    Raises:
        OSError: ``run_dir`` cannot be listed.
    """
    starts, size = 0, 0
    for name in os.listdir(run_dir):
        found = SUPERSEDED.search(name)
        if not found:
            continue
        starts = max(starts, int(found.group(1)))
        path = os.path.join(run_dir, name)
        walk = os.walk(path) if os.path.isdir(path) else [("", [], [path])]
        size += sum(os.lstat(os.path.join(top, f)).st_size for top, _, files in walk for f in files)
    if not starts:
        return None
    return (
        f"{run_dir} holds records of earlier runs set aside by {starts} start"
        f"{'s' if starts > 1 else ''} (*.superseded-N, {size / 2**20:.1f} MiB in all), which "
        f"nothing deletes. To delete them: rm -r {shlex.quote(run_dir)}/*.superseded-*"
    )


def set_aside_earlier_run(run_dir: str) -> list[str]:
    """Move aside what an earlier run left in ``run_dir`` that a fresh start (iteration 0,
    nothing resumed) would otherwise seem to have written: ``init_audit.json`` (the audit of
    another initialization; a run with ``--init-audit off`` writes none of its own) and
    ``analysis/`` (``analyze``'s default output, read off the earlier run's checkpoints). Each
    moves whole to :func:`superseded_path` (``init_audit.superseded-N.json``,
    ``analysis.superseded-N``); nothing is deleted. A resume must not call this: both describe
    the run it continues. ``metrics.jsonl`` and ``tensorboard/`` are :func:`continue_metrics`'
    and :func:`continue_tensorboard`'s.

    Args:
        run_dir: the run directory.

    Returns:
        One line per moved file or directory, saying what moved where (empty when none).
    """
    said = []
    for name, what in ((INIT_AUDIT, "init audit"), (ANALYSIS, "analysis")):
        path = os.path.join(run_dir, name)
        if not os.path.lexists(path):
            continue
        aside = superseded_path(path)
        move(path, aside)
        said.append(
            f"{path}: the {what} of an earlier run moved to {aside}; this run starts afresh"
        )
    return said


def continue_metrics(run_dir: str, start_iter: int) -> str | None:
    """Make ``RUN/metrics.jsonl`` hold only what a run starting after iteration ``start_iter``
    continues: the records up to ``start_iter`` when it resumes there, none when it starts at 0.

    Its readers keep the last value of each iteration, so the records of an earlier run beyond
    that point (a longer run that ``--overwrite`` replaces, or the iterations a crashed run went on
    to after its last checkpoint) would otherwise mix into this run's curves; and a torn last line
    (a run killed mid-write) would become a middle line that :func:`read_metrics` refuses once
    this run appends. Nothing is deleted: the old file moves to ``RUN/metrics.superseded-N.jsonl``
    (N the first free number) and the kept records are written back atomically. A file
    :func:`read_metrics` refuses moves whole.

    Args:
        run_dir: the run directory.
        start_iter: the iteration this run resumes after (0: a fresh start).

    Returns:
        A line saying what moved where, or None when nothing did (no file, or nothing past
        ``start_iter`` and no torn last line).
    """
    path = os.path.join(run_dir, METRICS)
    if not os.path.isfile(path):
        return None
    try:
        records = read_metrics(run_dir)
    except ValueError as e:
        kept, why = [], f"unreadable ({e})"
    else:
        kept = [r for r in records if start_iter and r.get("iteration", 0) <= start_iter]
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - 1, 0))
            torn = f.read(1) not in (b"", b"\n")
        if len(kept) == len(records) and not torn:
            return None
        dropped = len(records) - len(kept)
        why = f"{dropped} records past iteration {start_iter}" if start_iter else "its records"
        why += " and a torn last line" if torn else ""
    aside = superseded_path(path)
    move(path, aside)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    now = (
        f"resumes after iteration {start_iter} with a copy of the {len(kept)} records up to it"
        if start_iter
        else "starts afresh"
    )
    return f"{path}: the earlier run's file ({why}) moved whole to {aside}; this run {now}"


EVENTS_PREFIX = "events.out.tfevents."
"""How TensorBoard's event files are named (``SummaryWriter``)."""


def continue_tensorboard(tensorboard_dir: str, start_iter: int) -> tuple[Optional[str], int | None]:
    """Make the TensorBoard directory show only what a run starting after ``start_iter``
    continues, as :func:`continue_metrics` does for ``metrics.jsonl``.

    A fresh start (``start_iter`` 0) in a directory that holds event files moves the whole
    directory aside to ``TENSORBOARD_DIR.superseded-N`` (N the first free number; nothing is
    deleted), so that this run's curves do not mix with an earlier model's. A resume keeps the
    event files and returns the purge step ``start_iter + 1`` for ``SummaryWriter(purge_step=)``:
    its first event tells TensorBoard to drop the earlier files' events at later steps (those
    of the iterations a crashed run went on to after its last checkpoint), as the records past
    ``start_iter`` leave ``metrics.jsonl``.

    Args:
        tensorboard_dir: the run's TensorBoard event directory.
        start_iter: the iteration this run resumes after (0: a fresh start).

    Returns:
        (a line saying what moved where, or None when nothing did; the purge step, or None for
        a fresh start).
    """
    if start_iter:
        return None, start_iter + 1
    if not os.path.isdir(tensorboard_dir) or not any(
        name.startswith(EVENTS_PREFIX) for name in os.listdir(tensorboard_dir)
    ):
        return None, None
    base = os.path.normpath(tensorboard_dir)
    aside = superseded_path(base)
    move(base, aside)
    return (
        f"{base}: the event files of an earlier run moved to {aside}; this run starts afresh",
        None,
    )


def read_metrics(run_dir: str) -> list[dict]:
    """The records of ``RUN/metrics.jsonl`` in file order (empty without the file).

    A torn last line (the run was killed mid-write) is skipped with a logged warning that names
    the file and line; blank lines are skipped.

    Raises:
        ValueError: a line other than the last that is not a JSON object (names file and line).
    """
    path = os.path.join(run_dir, METRICS)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if n == len(lines):
                _log.warning(
                    "%s:%d: torn last line skipped (the run was stopped mid-write): %s", path, n, e
                )
                continue
            raise ValueError(
                f"{path}:{n}: not a JSON object ({e}). Fix: repair or delete that line"
            ) from e
        records.append(record)
    return records

"""Atomic, layout-independent checkpoints with megatron-core ``dist_checkpointing``.

Layout of a checkpoint directory::

    SAVE/iter_0000010/                     one complete checkpoint (torch_dist format)
    SAVE/iter_0000020.partial/             a save in progress (ignored by resume)
    SAVE/latest_checkpointed_iteration.txt the newest complete iteration (Megatron-LM's tracker)

(names, discovery and every read of these files: :mod:`megatron_gamma.rundir`). Each checkpoint
also carries the run's resolved config and tokenizer fingerprint in its common state
(:func:`megatron_gamma.rundir.layout.describe`), so it can be read without its run directory.

All ranks write into ``iter_N.partial``; after every rank has finished, rank 0 renames it to
``iter_N`` and then rewrites the tracker (temp file + rename). A crash mid-save therefore leaves
the previous checkpoint and tracker untouched. Model and optimizer state are ShardedTensors keyed
by global names, so a checkpoint saved under one TP/PP layout loads under another (the
distributed optimizer uses the ``fully_reshardable`` format). Per-rank RNG states are restored
when the layout is unchanged.

Retention (``--save-retain-last K``, ``--save-retain-interval N``) runs on rank 0 after the
tracker names the new checkpoint: each checkpoint outside the kept set (the newest K, every
multiple of N, and always the newest) is first renamed to ``iter_N.deleting`` (no longer a
checkpoint to resume from) and then removed. A crash between a save and its deletions leaves a
superset of the kept set, which the next save thins; leftover ``*.deleting`` and stale
``*.partial`` directories of older iterations are removed then too.

What a load restores (Megatron-LM's flags): everything by default; the weights only with
``--finetune`` / ``--pretrained-checkpoint`` (iteration 0, fresh optimizer, schedule and RNG);
all but the optimizer with ``--no-load-optim``; all but the RNG with ``--no-load-rng``.
Checkpoints written with ``--no-save-optim`` and by ``import-hf`` (weights only) record what
they lack, and a load that needs it is a :class:`ConfigError` naming the flag to add.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shlex
import shutil
import socket
from dataclasses import dataclass
from typing import IO

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

from megatron_gamma import checkpoint_trust
from megatron_gamma.atomic import (
    LinkedFileError,
    atomic_write_text,
    move,
    open_in_place,
    refuse_link,
)
from megatron_gamma.compat import patch_distributed_optimizer_load, patch_save_results_queue
from megatron_gamma.config import ConfigError
from megatron_gamma.rundir.layout import (
    METRICS,
    NOT_LOADED_OPTIMIZER,
    NOT_LOADED_RNG,
    TRACKER,
    checkpoint_dir,
    latest_iteration,
    optimizer_layout_fix,
    read_common,
    read_state,
)
from megatron_gamma.rundir.layout import description as common_description
from megatron_gamma.rundir.loader import load_model_weights
from megatron_gamma.rundir.paths import check_takeover

_ITER_DIR = re.compile(r"^iter_(\d{7})$")
_PARTIAL_DIR = re.compile(r"^iter_(\d{7})\.partial$")
_SAVE_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


@dataclass
class TrainState:
    """Progress that a checkpoint restores besides the weights: iterations, samples and tokens
    trained on (tokens summed step by step, so a resume at another ``--seq-length`` keeps the
    earlier steps' count)."""

    iteration: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0


def check_load_dir(load: str | None) -> None:
    """Refuse, before anything is written, a ``load`` that is a file (the run's config.yaml or
    the tracker file, passed by mistake): it holds no checkpoint, and the run would otherwise
    start from scratch without a word (a ``load`` that does not exist gets
    :func:`missing_load_warning`).

    Raises:
        ConfigError: naming the file and the fix.
    """
    if load and os.path.exists(load) and not os.path.isdir(load):
        raise ConfigError(
            f"load={load!r}: is a file, not a checkpoint directory. Fix: pass the --save "
            "directory of the run to resume (or drop --load)"
        )


def missing_load_warning(load: str | None, save: str | None, pretrained: str | None) -> str | None:
    """The warning for a ``--load`` path that does not exist, or None.

    Like Megatron-LM, a run with no checkpoint to load starts fresh; a ``load`` that does not
    exist at all is most often a typo, so it is named. No warning for a ``load`` that exists
    (an empty directory starts fresh, as documented), nor for one that is also ``save``: the
    automatic-resume pattern, whose first run finds nothing yet.

    Args:
        load: ``--load`` (None: nothing to load).
        save: ``--save``.
        pretrained: ``--pretrained-checkpoint``, whose weights a fresh start takes.

    Returns:
        The warning, naming the path, where training starts and the fix; None when no
        warning is due.
    """
    if not load or os.path.exists(load):
        return None
    if save and os.path.realpath(save) == os.path.realpath(load):
        return None
    start = (
        f"from the weights of --pretrained-checkpoint {shlex.quote(pretrained)} at iteration 0"
        if pretrained
        else "from scratch"
    )
    return (
        f"load={load!r}: does not exist, so there is no checkpoint to resume and training "
        f"starts {start}. Fix: if the path is a typo, pass the directory the run to resume "
        "saved into (its --save); to resume automatically, give --load and --save the same "
        "directory"
    )


LOCK = ".lock"


def _exclusive(
    key: str, directory: str, lock_name: str, busy: str, fix: str
) -> tuple[IO | None, str | None]:
    """On rank 0: make ``directory`` and take an exclusive ``fcntl.flock`` of its
    ``lock_name``.

    Returns:
        (the open lock file, None); (None, the refusal ``'KEY=DIR: BUSY (...). Fix: FIX'``) when
        another process holds the lock; (None, the refusal ``'KEY=DIR: ...'``) when the lock
        file is a symbolic link (:func:`~megatron_gamma.atomic.open_in_place`: the lock would
        truncate what it points to); (None, None) where the file system cannot lock (some
        NFS / Lustre mounts), after a printed warning that a second run would not be refused;
        (None, the refusal ``'KEY=DIR: ...'``) when ``directory`` is not a directory and cannot
        be made one (a file is there, or on its path).
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        there = "exists and is not a directory" if os.path.lexists(directory) else "cannot be made"
        return None, (
            f"{key}={directory!r}: {there} ({e.strerror}). Fix: pass a directory path, a new one "
            "or an existing directory"
        )
    try:
        return _lock(os.path.join(directory, lock_name)), None
    except BlockingIOError as e:
        return None, f"{key}={directory!r}: {busy} ({e}). Fix: {fix}"
    except LinkedFileError as e:  # the lock file is truncated and rewritten: never through a link
        return None, f"{key}={directory!r}: {e}"
    except OSError as e:
        print(
            f"WARNING: {key}={directory!r}: cannot be locked ({e}); a second run writing into it "
            "would not be refused",
            flush=True,
        )
        return None, None


def claim_save_dir(save: str | None, delete_existing: bool) -> IO | None:
    """Make this run the only writer of ``save``: rank 0 takes an exclusive ``fcntl.flock`` of
    ``SAVE/.lock`` (held until the returned file is passed to :func:`release_lock`, or the
    process ends), then with ``delete_existing`` (``--overwrite`` without ``--load``) deletes
    the checkpoints already there (every ``iter_N``, ``*.partial``, ``*.deleting`` and the
    tracker). The outcome is broadcast, so that every rank stops together. Collective over the
    world group; call it before anything else is written into ``save``.

    Returns:
        The open lock file on rank 0 (None on the other ranks and without ``save``).

    Raises:
        CheckpointError: on every rank, when another process holds the lock, when
            ``SAVE/.lock`` is a symbolic link (:func:`~megatron_gamma.atomic.open_in_place`), or
            when ``save`` is not a directory and cannot be made one (:func:`_exclusive`).
    """
    if not save:
        return None
    handle, outcome = None, [None]
    if dist.get_rank() == 0:
        handle, outcome[0] = _exclusive(
            "save", save, LOCK, "another process is writing checkpoints into it",
            "wait for it to end, or give this run another --save",
        )  # fmt: skip
        if outcome[0] is None and delete_existing:
            deleted = []
            for name in sorted(os.listdir(save)):
                path = os.path.join(save, name)
                if name == TRACKER:
                    os.remove(path)
                elif _ITER_DIR.match(name) or name.endswith((".partial", ".deleting")):
                    shutil.rmtree(path)
                    deleted.append(name)
            if deleted:
                print(
                    f"--overwrite: deleted the earlier run's checkpoints in {save}: "
                    f"{', '.join(deleted)}",
                    flush=True,
                )
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise checkpoint_trust.CheckpointError(outcome[0])
    return handle


RUN_LOCK = ".run.lock"


def claim_run_dir(run_dir: str, load: str | None, overwrite: bool) -> tuple[IO | None, str | None]:
    """Make this run the only one writing ``run_dir``: rank 0 (the process that writes the run
    directory) takes an exclusive ``fcntl.flock`` of ``RUN/.run.lock`` (held until the returned
    file is passed to :func:`release_lock`, or the process ends), then, without ``overwrite``,
    refuses to take over a directory that holds an earlier run's records
    (:func:`~megatron_gamma.rundir.paths.check_takeover`: the command line ran it before torch
    was imported, without the lock; here it runs under the lock, for what was written into
    ``run_dir`` since, and for a run started without the command line), and refuses a
    ``RUN/.run.lock`` or ``RUN/metrics.jsonl`` that is a symbolic link (both are written in
    place: :func:`~megatron_gamma.atomic.open_in_place`). The outcome is broadcast, so that
    every rank stops together. Collective over the world group; call it before anything is
    written into ``run_dir`` or ``save``.

    Args:
        run_dir: the run directory (``--run-dir``).
        load: the run's ``--load`` (None: a fresh start).
        overwrite: ``--overwrite``: start afresh in a directory another run wrote.

    Returns:
        (the open lock file on rank 0, None on the other ranks and where the file system
        cannot lock: a warning is printed; on rank 0, where this run takes over the directory
        of a run that never finished an iteration, the line saying so (the caller prints it
        and moves that run's records aside, even on a resume), else None).

    Raises:
        ConfigError: on every rank, when another live process holds the lock (naming the
            directory, the holder and the fix), when the run would take over another run's
            directory, when its lock file or ``metrics.jsonl`` is a symbolic link, or when
            ``run_dir`` is not a directory and cannot be made one (:func:`_exclusive`).
    """
    handle, outcome, takeover = None, [None], None
    if dist.get_rank() == 0:
        handle, outcome[0] = _exclusive(
            "run_dir", run_dir, RUN_LOCK, "another run is writing into it",
            "give this run its own --run-dir DIR, or wait for that run to end",
        )  # fmt: skip
        if outcome[0] is None:
            try:
                refuse_link(os.path.join(run_dir, METRICS))  # appended to in place
                if not overwrite:
                    takeover = check_takeover(run_dir, load)
            except LinkedFileError as e:
                release_lock(handle)
                handle, outcome[0] = None, f"run_dir={run_dir!r}: {e}"
            except ConfigError as e:
                release_lock(handle)
                handle, outcome[0] = None, str(e)
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise ConfigError(outcome[0])
    return handle, takeover


def _lock(path: str) -> IO:
    """``path`` opened and exclusively flock'ed, recording this process; retried when the file
    was replaced between the open and the lock (a previous holder removing it on release).

    Raises:
        BlockingIOError: another process holds it (the message names the holder).
        LinkedFileError: ``path`` is a symbolic link (:func:`~megatron_gamma.atomic.open_in_place`).
    """
    while True:
        handle = open(path, "a+", opener=open_in_place)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process"
            handle.close()
            raise BlockingIOError(f"{holder} holds {path}") from None
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
                break
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def release_lock(handle: IO | None) -> None:
    """Remove and unlock the lock file of :func:`claim_save_dir` or :func:`claim_run_dir`
    (no-op for None)."""
    if handle is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(handle.name)
    handle.close()


def _layout() -> dict:
    """Sizes that decide whether per-rank RNG states can be restored."""
    return {
        "tp": parallel_state.get_tensor_model_parallel_world_size(),
        "pp": parallel_state.get_pipeline_model_parallel_world_size(),
        "dp": parallel_state.get_data_parallel_world_size(),
    }


def _rng_state() -> dict:
    state = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _sharded_rng(state: dict | None) -> ShardedObject:
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = (
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_rank(),
    )
    return ShardedObject(
        "rng_state", state, (pp, tp), rank, replica_id=parallel_state.get_data_parallel_rank()
    )


def _is_distributed(optimizer) -> bool:
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(type(o).__name__ == "DistributedOptimizer" for o in inner)


def _prime_torch_adam_state(optimizer) -> None:
    """Give a never-stepped torch Adam inside megatron-core's DistributedOptimizer its
    per-parameter state (zero moments, step 0: what a first step would start from).

    Without apex / Transformer Engine, megatron-core 0.16's ``DistributedOptimizer.state_dict``
    (called while building the *loading* state dict) reads one common Adam ``step`` from the
    torch optimizer's per-parameter state, which a fresh optimizer does not have yet. The load
    then overwrites every value.
    """
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        if type(inner).__name__ != "DistributedOptimizer" or not isinstance(
            torch_opt, torch.optim.Adam | torch.optim.AdamW
        ):
            continue
        for group in torch_opt.param_groups:
            for p in group["params"]:
                state = torch_opt.state[p]
                if "step" not in state:
                    state.setdefault("exp_avg", torch.zeros_like(p.data))
                    state.setdefault("exp_avg_sq", torch.zeros_like(p.data))
                    state["step"] = torch.tensor(0.0)


def _sgd_init_state(opt: torch.optim.SGD, config=None) -> None:
    """The ``init_state_fn`` megatron-core 0.16 leaves out for torch SGD (it passes None, which
    its FP32 and float16 optimizers call while building the *loading* state dict): the momentum
    buffers a first step would create, zeros (none where momentum is 0). The load then
    overwrites every value."""
    for group in opt.param_groups:
        if group["momentum"]:
            for p in group["params"]:
                opt.state[p].setdefault("momentum_buffer", torch.zeros_like(p.data))


def _prime_sgd_state(optimizer) -> None:
    """Give each megatron-core optimizer that wraps torch SGD without an ``init_state_fn``
    :func:`_sgd_init_state`, so that an SGD run can resume with its optimizer state."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        wrapped = getattr(inner, "optimizer", None)
        if isinstance(wrapped, torch.optim.SGD) and getattr(inner, "init_state_fn", 0) is None:
            inner.init_state_fn = _sgd_init_state


def _model_state_dict(chunks) -> dict:
    return {
        "model" if len(chunks) == 1 else f"model{i}": chunk.module.sharded_state_dict()
        for i, chunk in enumerate(chunks)
    }


def _state_dict(
    chunks, optimizer, scheduler, state: TrainState, rng, loading: bool, with_optim: bool = True
) -> dict:
    sd = _model_state_dict(chunks)
    if with_optim:
        sd["optimizer"] = optimizer.sharded_state_dict(
            sd, is_loading=loading, metadata=_SAVE_METADATA
        )
    sd["has_optimizer"] = with_optim
    sd["scheduler"] = scheduler.state_dict()
    sd["iteration"] = state.iteration
    sd["consumed_samples"] = state.consumed_samples
    sd["consumed_tokens"] = state.consumed_tokens
    sd["layout"] = _layout()
    sd["distributed_optimizer"] = _is_distributed(optimizer)
    if rng is not None:
        sd["rng_state"] = _sharded_rng(rng)
    return sd


def retained(iterations: list[int], retain_last: int | None, retain_interval: int | None) -> set:
    """The checkpoint iterations that retention keeps out of ``iterations``: all of them without
    ``retain_last``; else the newest ``retain_last``, every multiple of ``retain_interval``, and
    always the newest."""
    if retain_last is None or not iterations:
        return set(iterations)
    newest = sorted(iterations)[-retain_last:]
    every = {i for i in iterations if retain_interval and i % retain_interval == 0}
    return set(newest) | every | {max(iterations)}


def apply_retention(root: str, retain_last: int | None, retain_interval: int | None) -> list[int]:
    """Delete the complete checkpoints under ``root`` that :func:`retained` does not keep (rank
    0 only; call after the newest save is complete and the tracker names it). Each is renamed to
    ``iter_N.deleting`` before it is removed, so a crash mid-deletion never leaves a partial
    ``iter_N``; leftover ``*.deleting`` directories and ``*.partial`` ones older than the newest
    checkpoint are removed too.

    Returns:
        The deleted iterations, ascending.
    """
    names = os.listdir(root)
    iterations = sorted(int(m.group(1)) for d in names if (m := _ITER_DIR.match(d)))
    keep = retained(iterations, retain_last, retain_interval)
    newest = max(iterations, default=0)
    deleted = [i for i in iterations if i not in keep]
    doomed = []
    for it in deleted:
        path = checkpoint_dir(root, it)
        move(path, path + ".deleting")
        doomed.append(path + ".deleting")
    for d in names:
        partial = _PARTIAL_DIR.match(d)
        if d.endswith(".deleting") or (partial and int(partial.group(1)) < newest):
            doomed.append(os.path.join(root, d))
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return deleted


def save_checkpoint(
    root: str,
    chunks,
    optimizer,
    scheduler,
    state: TrainState,
    save_optim: bool = True,
    retain_last: int | None = None,
    retain_interval: int | None = None,
    description: dict | None = None,
) -> str:
    """Save model chunks, optimizer, scheduler, progress and RNG as ``root/iter_N`` atomically,
    then apply retention (:func:`apply_retention`).

    Args:
        root: checkpoint directory (created if missing).
        chunks: DDP-wrapped model chunks of this rank (the GPTModel, ``chunk.module``, is saved
            under megatron-core's own parameter names, as Megatron-LM does).
        optimizer: megatron-core optimizer from ``get_megatron_optimizer``.
        scheduler: megatron-core ``OptimizerParamScheduler``.
        state: iteration and consumed samples.
        save_optim: include the optimizer state (``--no-save-optim``: False).
        retain_last: ``--save-retain-last`` (None: keep every checkpoint).
        retain_interval: ``--save-retain-interval``.
        description: common-state entries that describe the run
            (:func:`megatron_gamma.rundir.layout.describe`: its config and tokenizer).

    Returns:
        The final checkpoint directory.
    """
    final = checkpoint_dir(root, state.iteration)
    partial = final + ".partial"
    if dist.get_rank() == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    dist.barrier()
    sd = _state_dict(
        chunks, optimizer, scheduler, state, _rng_state(), loading=False, with_optim=save_optim
    )
    sd.update(description or {})
    patch_save_results_queue()
    dist_checkpointing.save(sd, partial, content_metadata=_SAVE_METADATA)
    dist.barrier()
    if dist.get_rank() == 0:
        if os.path.isdir(final):
            shutil.rmtree(final)
        move(partial, final)
        atomic_write_text(os.path.join(root, TRACKER), str(state.iteration))
        apply_retention(root, retain_last, retain_interval)
    dist.barrier()
    return final


def check_loadable(
    root: str,
    weights_only: bool,
    load_optim: bool,
    flag: str = "load",
    common: dict | None = None,
) -> None:
    """Refuse, before anything is built, a load that needs state the newest checkpoint under
    ``root`` does not hold (read from its common state only).

    Args:
        root: checkpoint directory.
        weights_only: the load takes the model weights only (``--finetune`` or
            ``--pretrained-checkpoint``).
        load_optim: the load restores the optimizer (not ``--no-load-optim``).
        flag: the config key that named ``root``, for the message.
        common: the common state of that newest checkpoint where the caller has read it already
            (:func:`~megatron_gamma.rundir.layout.read_common`); None: read here, where needed.

    Raises:
        ConfigError: ``root`` holds no complete checkpoint; or a full resume from a weights-only
            checkpoint (``import-hf``); or an optimizer load from a ``--no-save-optim`` one.
    """
    iteration = latest_iteration(root)
    if iteration is None:
        raise ConfigError(
            f"{flag}={root!r}: holds no complete checkpoint (no iter_N directory). Fix: point it "
            "at a directory a run saved into (its --save) or that import-hf wrote (RUN/checkpoints)"
        )
    if weights_only:
        return
    if common is None:
        common = read_common(checkpoint_dir(root, iteration))
    if "scheduler" not in common:
        raise ConfigError(
            f"{flag}={root!r}: iteration {iteration} holds model weights only (written by "
            f"import-hf), nothing to resume a run from. Fix: start from it with "
            f"--pretrained-checkpoint {shlex.quote(root)}, or --finetune --load {shlex.quote(root)}"
        )
    if load_optim and not common.get("has_optimizer", True):
        raise ConfigError(
            f"{flag}={root!r}: iteration {iteration} was saved with --no-save-optim and holds no "
            "optimizer state. Fix: add --no-load-optim (fresh optimizer at the checkpoint's "
            "iteration), or --finetune (weights only, iteration 0)"
        )


def load_weights(root: str, chunks, optimizer, strict: str) -> int:
    """Load only the model weights of the newest checkpoint under ``root`` (any layout, also
    ``import-hf`` output) into ``chunks``, and refresh the optimizer's main parameters from them
    (megatron-core ``reload_model_params``). The optimizer state, schedule and RNG stay fresh.
    ``strict``: key-mismatch handling of the read (``--dist-ckpt-strictness``).

    Returns:
        The iteration the weights were saved at.
    """
    iteration = latest_iteration(root)
    load_model_weights([chunk.module for chunk in chunks], checkpoint_dir(root, iteration), strict)
    optimizer.reload_model_params()
    return iteration


def load_checkpoint(
    root: str,
    chunks,
    optimizer,
    scheduler,
    load_optim: bool,
    load_rng: bool,
    strict: str,
    changed: tuple[str, ...] = (),
) -> TrainState | None:
    """Resume from the newest complete checkpoint under ``root``.

    Model and optimizer are resharded to the current layout by dist_checkpointing; RNG states
    are restored only when the TP/PP/DP layout equals the saved one.

    Args:
        load_optim: restore the optimizer state; False (``--no-load-optim``) keeps the fresh
            optimizer and refreshes its main parameters from the loaded weights.
        load_rng: restore the RNG states (``--no-load-rng``: False).
        strict: key-mismatch handling of the read (``--dist-ckpt-strictness``).
        changed: the model settings this run changed from the checkpoint's run
            (:func:`~megatron_gamma.rundir.layout.section_changes`), named where the model's
            tensors have other shapes than the checkpoint's.

    Returns:
        The restored progress, or None when ``root`` holds no complete checkpoint.

    Raises:
        ConfigError: an optimizer load from a checkpoint saved with the other
            ``use_distributed_optimizer`` (megatron-core converts no optimizer state between
            the two), naming both settings and the fixes (:func:`~megatron_gamma.rundir.
            layout.optimizer_layout_fix`: the flag as it was saved, or ``--no-load-optim``).
    """
    iteration = latest_iteration(root)
    if iteration is None:
        return None
    path = checkpoint_dir(root, iteration)
    common = read_common(path)
    saved_distributed = common.get("distributed_optimizer", False)
    if load_optim and saved_distributed != _is_distributed(optimizer):
        same = "--" + "no-" * (not saved_distributed) + "use-distributed-optimizer"
        raise ConfigError(
            f"use_distributed_optimizer={not saved_distributed}: {path} was saved with "
            f"use_distributed_optimizer={saved_distributed}, and megatron-core cannot convert "
            "optimizer state between the two. " + optimizer_layout_fix(f"{same}, as it was saved")
        )
    restore_rng = load_rng and common.get("layout") == _layout()
    template = _rng_state() if restore_rng else None
    if load_optim:
        _prime_torch_adam_state(optimizer)
        _prime_sgd_state(optimizer)
        patch_distributed_optimizer_load()
    sd = _state_dict(
        chunks, optimizer, scheduler, TrainState(), template, loading=True, with_optim=load_optim
    )
    if "consumed_tokens" not in common:  # a checkpoint of an older version
        del sd["consumed_tokens"]
    not_loaded = (NOT_LOADED_OPTIMIZER,) * (not load_optim) + (NOT_LOADED_RNG,) * (not restore_rng)
    loaded = read_state(sd, path, strict, not_loaded, changed=changed)
    for i, chunk in enumerate(chunks):
        chunk.module.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
    if load_optim:
        optimizer.load_state_dict(loaded["optimizer"])
    else:
        optimizer.reload_model_params()
    if scheduler.override_opt_param_scheduler:
        # megatron-core's param groups carry their own max_lr / min_lr (the checkpoint's after
        # the load), which the scheduler prefers to its own: give them the config's.
        for group in optimizer.param_groups:
            group["max_lr"], group["min_lr"] = scheduler.max_lr, scheduler.min_lr
    scheduler.load_state_dict(loaded["scheduler"])
    if restore_rng:
        _set_rng_state(loaded["rng_state"])
    samples = loaded["consumed_samples"]
    tokens = loaded.get("consumed_tokens")
    if tokens is None:  # the run's one seq_length, as its checkpoint recorded it
        seq_length = ((common_description(common)[0] or {}).get("model") or {}).get("seq_length")
        tokens = samples * seq_length if seq_length else 0
    return TrainState(loaded["iteration"], samples, tokens)

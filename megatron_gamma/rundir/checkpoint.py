"""One checkpoint and its run, read on a single rank for evaluation and export.

Wraps the single-rank loader :mod:`megatron_gamma.rundir.loader` (single-process megatron-core
state, the layout-independent dist_checkpointing load) and turns its failures into named errors
(:class:`~megatron_gamma.checkpoint_trust.CheckpointError`, :class:`TokenizerNotFoundError`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch
from torch.distributed.checkpoint.api import CheckpointException

from megatron_gamma import parallel
from megatron_gamma.checkpoint_trust import CheckpointError
from megatron_gamma.config import Config, ConfigError, RecordedPaths
from megatron_gamma.rundir import layout, loader, paths


class TokenizerNotFoundError(ConfigError):
    """The run's tokenizer.json (``tokenizer_model``) does not exist."""


@dataclass
class RunCheckpoint:
    """A resolved checkpoint directory, its run's config and tokenizer.

    Attributes:
        path: the ``iter_N`` directory.
        cfg: the run's config with fp32 weights (``bf16=False``) and one rank
            (:func:`~megatron_gamma.rundir.loader.fp32_single_rank`), for loading.
        tokenizer: the run's tokenizer.json.
        original: the run's config as saved (its layout and precision).
        recorded: where the relative input paths of the run's config were looked for
            (:func:`~megatron_gamma.rundir.loader.recorded_paths`), for the error of one found
            under none (:meth:`~megatron_gamma.config.DataConfig.blend`); None for a config
            given explicitly, or a checkpoint without its run's ``config.yaml``.
    """

    path: str
    cfg: Config
    tokenizer: str
    original: Config
    recorded: Optional[RecordedPaths] = None


def resolve(ckpt: str, config: Optional[str] = None) -> RunCheckpoint:
    """Find the checkpoint, its run's config (:func:`~megatron_gamma.rundir.loader.run_config`:
    ``config``, else the checkpoint's own, else the run's config.yaml) and the tokenizer.

    Args:
        ckpt: ``SAVE/iter_N``, a checkpoint root with the tracker file, or a run directory.
        config: a config.yaml that overrides the checkpoint's own config.

    Raises:
        CheckpointError: no complete checkpoint (missing, or only ``iter_N.partial``); for a
            missing path, the message names the three accepted forms and, when its parent
            directory holds ``iter_N`` checkpoints, those.
        ConfigError: an old checkpoint without its config and no config.yaml found.
        TokenizerNotFoundError: the run's tokenizer.json does not exist.
        ConfigError: the checkpoint was trained with another tokenizer than the config's
            (:func:`~megatron_gamma.rundir.loader.check_tokenizer`; a checkpoint without a
            tokenizer fingerprint loads with a warning on stderr).
    """
    missing = paths.missing_checkpoint(ckpt)
    if missing:
        raise CheckpointError(missing)
    try:
        path = layout.resolve_checkpoint(ckpt)
    except ConfigError as e:
        partial = (
            [n for n in os.listdir(ckpt) if n.endswith(".partial")] if os.path.isdir(ckpt) else []
        )
        why = f" (only the unfinished save {partial[0]})" if partial else ""
        raise CheckpointError(f"{e}{why}") from e
    # the path as given: a run directory whose --save lies elsewhere is the one that holds the
    # config.yaml locating the run's launch directory
    cfg = loader.run_config(ckpt, config)
    recorded = None if config is not None else loader.recorded_paths(ckpt)
    tokenizer = tokenizer_file(cfg, config or path, recorded)
    warning = loader.check_tokenizer(
        path,
        cfg,
        "pass --config with a config.yaml that selects the checkpoint's tokenizer ({flags}), or "
        "put those files back where the run's config names them",
    )
    if warning and parallel.read_dist_env().rank == 0:
        print(warning, file=sys.stderr)
    return RunCheckpoint(path, loader.fp32_single_rank(cfg), tokenizer, cfg, recorded)


def tokenizer_file(
    cfg: Config, source: str, recorded: Optional[RecordedPaths], flag: str = "--config"
) -> str:
    """The run's tokenizer.json (:func:`~megatron_gamma.rundir.loader.tokenizer_path`), which
    must exist.

    Args:
        cfg: the run's config, its relative paths resolved as a read command resolves them.
        source: where ``cfg`` came from (a checkpoint, or the config.yaml given), for the error.
        recorded: where its relative paths were looked for (None: ``cfg`` came from the
            config.yaml given); the error names those directories.
        flag: the caller's option that passes a config.yaml instead, for the fix.

    Raises:
        TokenizerNotFoundError: no such file; a relative path's error names the directories
            tried, or says that it is read from the directory the run was launched from.
    """
    tokenizer = loader.tokenizer_path(cfg)
    if os.path.isfile(tokenizer):
        return tokenizer
    relative = ""
    if not os.path.isabs(tokenizer) and recorded is not None:
        relative = f"; {recorded.where(tokenizer)}"
    elif not os.path.isabs(tokenizer):
        relative = (
            f", a path relative to the directory the run was launched from, not to this one "
            f"({os.getcwd()})"
        )
    raise TokenizerNotFoundError(
        f"tokenizer_model={tokenizer!r}: file not found (the run's tokenizer, from "
        f"{source}{relative}). Fix: restore it, run from the directory the run was launched "
        f"from, or pass {flag} with a config.yaml whose tokenizer_model points at the "
        "tokenizer.json the run was trained with"
    )


def load_model(run: RunCheckpoint) -> tuple[torch.nn.Module, int]:
    """The checkpoint's weights in a single-rank fp32 GPTModel (eval mode).

    Must run inside :func:`~megatron_gamma.rundir.loader.single_process` (or initialized
    megatron-core state, TP = PP = 1).

    Returns:
        (model, iteration).

    Raises:
        CheckpointError: unreadable metadata or tensors (corrupt or truncated files), or a
            pickled part that references a class no megatron-core checkpoint holds
            (:mod:`megatron_gamma.checkpoint_trust`).
        ConfigError: the model built from the run's config does not fit the checkpoint:
            tensors it lacks or of other shapes, or model weights it holds that the model does
            not take (they would be dropped, and another model scored), with the fix
            (:data:`~megatron_gamma.rundir.loader.READ_FIX`).
    """
    try:
        model = loader.model_for_run(run.cfg, run.path)
        iteration = loader.load_model_weights([model], run.path, "raise_all", loader.READ_FIX)
    except ConfigError:  # named already: a CheckpointError, or a model the checkpoint does not fit
        raise
    except (Exception, CheckpointException) as e:  # many types for damaged files (a data file
        # that cannot be read is a CheckpointError naming it, from checkpoint_trust); torch's
        # CheckpointException derives from BaseException
        raise CheckpointError(
            f"checkpoint={run.path!r}: cannot be read ({type(e).__name__}: {e}). Fix: use a "
            "complete checkpoint of this run (an earlier iter_N, or rerun the save)"
        ) from e
    return model, iteration

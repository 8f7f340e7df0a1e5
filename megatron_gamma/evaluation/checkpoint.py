"""One checkpoint and its run, read on a single rank for evaluation and export.

Wraps :mod:`megatron_gamma.diagnostics.offline` (single-process megatron-core state, the
layout-independent dist_checkpointing load) and turns its failures into the named errors of
:mod:`megatron_gamma.evaluation.errors`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch.distributed.checkpoint.api import CheckpointException

from megatron_gamma.config import Config, ConfigError, config_from_dict
from megatron_gamma.diagnostics import offline
from megatron_gamma.evaluation.errors import CheckpointError, TokenizerNotFoundError


@dataclass
class RunCheckpoint:
    """A resolved checkpoint directory, its run's config and tokenizer.

    Attributes:
        path: the ``iter_N`` directory.
        cfg: the run's config with fp32 weights (``bf16=False``) and TP = PP = 1, for loading.
        tokenizer: the run's tokenizer.json.
        original: the run's config as saved (its layout and precision).
    """

    path: str
    cfg: Config
    tokenizer: str
    original: Config


def fp32_single_rank(cfg: Config) -> Config:
    """``cfg`` rebuilt (through :func:`config_from_dict`, so every check runs again) with fp32
    weights, TP = PP = EP = 1, no virtual stages and no distributed optimizer; iteration-based
    without a batch-size ramp-up (``train_iters`` keeps its value), so evaluation may change the
    batch sizes."""
    raw = cfg.to_dict()
    raw["training"].update(bf16=False, fp16=False, train_samples=None, rampup_batch_size=None)
    raw["parallel"].update(
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=1,
        num_layers_per_virtual_pipeline_stage=None,
        virtual_pipeline_model_parallel_size=None,
        num_virtual_stages_per_pipeline_rank=None,
        use_distributed_optimizer=False,
        overlap_param_gather=False,
        sequence_parallel=False,
    )
    return config_from_dict(raw)


def resolve(ckpt: str, config: Optional[str] = None) -> RunCheckpoint:
    """Find the checkpoint, its config.yaml (beside it, or ``config``) and the tokenizer.

    Args:
        ckpt: ``SAVE/iter_N``, a checkpoint root with the tracker file, or a run directory.
        config: the run's config.yaml, for a checkpoint outside its run directory.

    Raises:
        CheckpointError: no complete checkpoint (missing, or only ``iter_N.partial``).
        ConfigError: no config.yaml found.
        TokenizerNotFoundError: the run's tokenizer.json does not exist.
    """
    if not os.path.exists(ckpt):
        raise CheckpointError(f"checkpoint={ckpt!r}: does not exist. Fix: pass SAVE/iter_NNNNNNN")
    try:
        path = offline.resolve_checkpoint(ckpt)
    except ConfigError as e:
        partial = (
            [n for n in os.listdir(ckpt) if n.endswith(".partial")] if os.path.isdir(ckpt) else []
        )
        why = f" (only the unfinished save {partial[0]})" if partial else ""
        raise CheckpointError(f"{e}{why}") from e
    cfg_path = config or offline.find_run_config(path)
    cfg = offline.load_run_config(cfg_path)
    tokenizer = offline.tokenizer_path(cfg)
    if not os.path.isfile(tokenizer):
        raise TokenizerNotFoundError(
            f"tokenizer_model={tokenizer!r}: file not found (the run's tokenizer, from "
            f"{cfg_path}). Fix: restore it, or pass --config with a config.yaml whose "
            "tokenizer_model points at the tokenizer.json the run was trained with"
        )
    return RunCheckpoint(path, fp32_single_rank(cfg), tokenizer, cfg)


def load_model(run: RunCheckpoint) -> tuple[torch.nn.Module, int]:
    """The checkpoint's weights in a single-rank fp32 GPTModel (eval mode).

    Must run inside :func:`~megatron_gamma.diagnostics.offline.single_process` (or initialized
    megatron-core state, TP = PP = 1).

    Returns:
        (model, iteration).

    Raises:
        CheckpointError: unreadable metadata or tensors (corrupt or truncated files), tensors
            that do not fit the run's architecture, or a pickled part that references a class
            no megatron-core checkpoint holds (:mod:`megatron_gamma.checkpoint_trust`).
    """
    try:
        model = offline.model_for_run(run.cfg, run.path)
        iteration = offline.load_weights(model, run.path)
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # many types for damaged files; torch's
        # CheckpointException (raised for unreadable tensor files) derives from BaseException
        raise CheckpointError(
            f"checkpoint={run.path!r}: cannot be read ({type(e).__name__}: {e}). Fix: use a "
            "complete checkpoint of this run (an earlier iter_N, or rerun the save)"
        ) from e
    return model, iteration

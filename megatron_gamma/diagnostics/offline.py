"""Single-process model loading for offline analysis (``analyze``, ``compare``).

Checkpoints are megatron-core ``dist_checkpointing`` (torch_dist) directories whose tensors are
keyed by global names and shapes, so a checkpoint written under any TP/PP/DP layout loads into a
freshly built single-rank model (TP = PP = 1): that is how every checkpoint is read here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Optional

import torch

from megatron_gamma import checkpoint_trust, parallel
from megatron_gamma.config import Config, ConfigError, load_config
from megatron_gamma.data import demo_dir
from megatron_gamma.data.tokenizer import BilingualTokenizer
from megatron_gamma.training.checkpointing import (
    TRACKER,
    checkpoint_dir,
    latest_iteration,
)

_ITER_PREFIX = "iter_"


def single_rank_config(cfg: Config) -> Config:
    """``cfg`` rebuilt (through the validated constructor) for one process: TP = expert TP =
    PP = EP = 1, no virtual pipeline stages, no sequence parallelism, no distributed optimizer or
    overlapped gradient reduction or parameter gather. Any run's checkpoint loads into the model
    it builds."""
    return cfg.replace(
        tensor_model_parallel_size=1,
        expert_tensor_parallel_size=1,
        pipeline_model_parallel_size=1,
        num_layers_per_virtual_pipeline_stage=None,
        virtual_pipeline_model_parallel_size=None,
        num_virtual_stages_per_pipeline_rank=None,
        expert_model_parallel_size=1,
        sequence_parallel=False,
        use_distributed_optimizer=False,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
    )


_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


@contextlib.contextmanager
def single_process(cfg: Config) -> Iterator[None]:
    """Initialize a one-process torch.distributed group and megatron-core parallel state
    (TP = PP = 1, via :func:`megatron_gamma.parallel.initialize`), and tear them down after.

    The launcher variables are hidden meanwhile and the environment is restored after, so the
    ``MASTER_ADDR``/``MASTER_PORT`` picked here are not inherited by processes started later
    (whose rendezvous would find the port still in TIME_WAIT)."""
    saved = {k: os.environ.get(k) for k in (*_LAUNCH_VARS, "MASTER_ADDR", "MASTER_PORT")}
    for var in _LAUNCH_VARS:
        os.environ.pop(var, None)
    try:
        parallel.initialize(single_rank_config(cfg))
        try:
            yield
        finally:
            parallel.destroy()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def is_checkpoint(path: str) -> bool:
    """True for one complete dist_checkpointing directory (``.../iter_N`` with metadata)."""
    return os.path.isfile(os.path.join(path, "metadata.json"))


def checkpoint_iteration(path: str) -> int:
    """Iteration of a checkpoint directory: its ``iter_N`` name, else the saved ``iteration``."""
    name = os.path.basename(os.path.normpath(path))
    if name.startswith(_ITER_PREFIX) and name[len(_ITER_PREFIX) :].isdigit():
        return int(name[len(_ITER_PREFIX) :])
    return int(checkpoint_trust.load_common_state_dict(path)["iteration"])


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """Complete checkpoints under ``root`` as (iteration, directory), oldest first.

    ``root`` may be a run directory (with ``checkpoints/``), a checkpoint root (with
    ``iter_N`` directories) or one checkpoint. ``.partial`` saves are ignored.
    """
    if is_checkpoint(root):
        return [(checkpoint_iteration(root), root)]
    for base in (root, os.path.join(root, "checkpoints")):
        if not os.path.isdir(base):
            continue
        found = []
        for name in os.listdir(base):
            path = os.path.join(base, name)
            suffix = name[len(_ITER_PREFIX) :]
            if name.startswith(_ITER_PREFIX) and suffix.isdigit() and is_checkpoint(path):
                found.append((int(suffix), path))
        if found:
            return sorted(found)
    return []


def resolve_checkpoint(path: str) -> str:
    """One checkpoint directory from a checkpoint, a checkpoint root or a run directory (the
    newest complete checkpoint, per Megatron's tracker file).

    Raises:
        ConfigError: nothing that looks like a checkpoint at ``path``.
    """
    if is_checkpoint(path):
        return path
    for base in (path, os.path.join(path, "checkpoints")):
        if os.path.isfile(os.path.join(base, TRACKER)) or os.path.isdir(base):
            it = latest_iteration(base)
            if it is not None and is_checkpoint(checkpoint_dir(base, it)):
                return checkpoint_dir(base, it)
    raise ConfigError(
        f"checkpoint={path!r}: no complete checkpoint found. Fix: pass SAVE/iter_NNNNNNN, a "
        "checkpoint directory with latest_checkpointed_iteration.txt, or a run directory"
    )


def find_run_config(path: str) -> str:
    """``config.yaml`` of the run that wrote ``path``: in ``path`` or up to three levels up.

    Raises:
        ConfigError: none found.
    """
    here = os.path.abspath(path)
    for _ in range(4):
        candidate = os.path.join(here, "config.yaml")
        if os.path.isfile(candidate):
            return candidate
        here = os.path.dirname(here)
    raise ConfigError(
        f"path={path!r}: no config.yaml in it or its parents (every run writes one into its "
        "run directory). Fix: pass the run's config explicitly"
    )


def load_run_config(config_path: str, run_dir: Optional[str] = None) -> Config:
    """Read a run's saved config.yaml; point ``run_dir`` at where the run actually lies."""
    cfg = load_config(config_path)
    return cfg.replace(run_dir=run_dir or os.path.dirname(os.path.abspath(config_path)))


def tokenizer_path(cfg: Config) -> str:
    """The run's tokenizer.json (the packaged demo tokenizer by default; for
    ``--tokenizer-type GPT2BPETokenizer`` the one made from its vocab and merges files in the
    run directory, :mod:`megatron_gamma.data.tokenizer_types`)."""
    if cfg.data.tokenizer_type == "GPT2BPETokenizer":
        from megatron_gamma.data.tokenizer_types import load_tokenizer

        return load_tokenizer(cfg.data, cfg.logging.run_dir).path
    return cfg.data.tokenizer_model or os.path.join(demo_dir(), "tokenizer.json")


def tokenizer_digest(cfg: Config) -> str:
    """SHA-256 of the run's tokenizer file (equal digests: same token ids)."""
    with open(tokenizer_path(cfg), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def checkpoint_vocab_size(ckpt: str) -> Optional[int]:
    """Padded vocabulary size stored in a checkpoint (global embedding/output rows)."""
    meta = checkpoint_trust.load_tensors_metadata(ckpt)
    for key in (
        "embedding.word_embeddings.weight",
        "output_layer.weight",
    ):
        if key in meta:
            return int(meta[key].global_shape[0])
    return None


def build_model(cfg: Config, vocab_size: int) -> torch.nn.Module:
    """A single-rank GPTModel for ``cfg`` (initialized by the run's rule and seed), eval mode.

    Must run inside :func:`single_process`.
    """
    from megatron_gamma.model.builder import build_model_chunk, transformer_config

    one = single_rank_config(cfg)
    model, _ = build_model_chunk(
        one, transformer_config(one, on_gpu=parallel.uses_gpu()), vocab_size
    )
    if parallel.uses_gpu():
        model.cuda()
    return model.eval()


def load_weights(model: torch.nn.Module, ckpt: str) -> int:
    """Load the model weights of checkpoint ``ckpt`` (any saved layout) into ``model``.

    Returns:
        The checkpoint's iteration.

    Raises:
        CheckpointError: a pickled part references a class no megatron-core checkpoint holds
            (:mod:`megatron_gamma.checkpoint_trust`).
        ConfigError: the checkpoint does not match the model (different architecture).
    """
    sharded = {"model": model.sharded_state_dict()}
    try:
        loaded = checkpoint_trust.load(sharded, ckpt)
    except checkpoint_trust.CheckpointError:
        raise
    except Exception as e:  # megatron-core raises several types for shape/key mismatches
        raise ConfigError(
            f"checkpoint={ckpt!r} does not fit the model built from the run's config ({e}). "
            "Fix: pass the config.yaml of the run that wrote this checkpoint"
        ) from e
    model.load_state_dict(loaded["model"], strict=True)
    return int(checkpoint_trust.load_common_state_dict(ckpt)["iteration"])


def model_for_run(cfg: Config, ckpt: Optional[str]) -> torch.nn.Module:
    """Build the run's model with the vocabulary size of ``ckpt`` (else of the tokenizer)."""
    from megatron_gamma.model.builder import padded_vocab_size

    vocab = checkpoint_vocab_size(ckpt) if ckpt else None
    if vocab is None:
        vocab = padded_vocab_size(BilingualTokenizer(tokenizer_path(cfg)).vocab_size, cfg)
    return build_model(cfg, vocab)

"""Atomic, layout-independent checkpoints with megatron-core ``dist_checkpointing``.

Layout of a checkpoint directory::

    SAVE/iter_0000010/                     one complete checkpoint (torch_dist format)
    SAVE/iter_0000020.partial/             a save in progress (ignored by resume)
    SAVE/latest_checkpointed_iteration.txt the newest complete iteration (Megatron-LM's tracker)

All ranks write into ``iter_N.partial``; after every rank has finished, rank 0 renames it to
``iter_N`` and then rewrites the tracker (temp file + rename). A crash mid-save therefore leaves
the previous checkpoint and tracker untouched. Model and optimizer state are ShardedTensors keyed
by global names, so a checkpoint saved under one TP/PP layout loads under another (the
distributed optimizer uses the ``fully_reshardable`` format). Per-rank RNG states are restored
when the layout is unchanged.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

from megatron_gamma.compat import patch_distributed_optimizer_load
from megatron_gamma.config import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")
_SAVE_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


@dataclass
class TrainState:
    """Progress that a checkpoint restores besides the weights."""

    iteration: int = 0
    consumed_samples: int = 0


def checkpoint_dir(root: str, iteration: int) -> str:
    """``root/iter_0000010`` for iteration 10."""
    return os.path.join(root, f"iter_{iteration:07d}")


def latest_iteration(root: str) -> int | None:
    """Newest complete checkpoint under ``root``: the tracker, else the highest ``iter_N``."""
    tracker = os.path.join(root, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker) as f:
            it = int(f.read().strip())
        if os.path.isdir(checkpoint_dir(root, it)):
            return it
    if not os.path.isdir(root):
        return None
    found = [int(m.group(1)) for d in os.listdir(root) if (m := _ITER_DIR.match(d))]
    return max(found) if found else None


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


def _state_dict(chunks, optimizer, scheduler, state: TrainState, rng, loading: bool) -> dict:
    sd: dict = {}
    for i, chunk in enumerate(chunks):
        sd["model" if len(chunks) == 1 else f"model{i}"] = chunk.module.sharded_state_dict()
    sd["optimizer"] = optimizer.sharded_state_dict(sd, is_loading=loading, metadata=_SAVE_METADATA)
    sd["scheduler"] = scheduler.state_dict()
    sd["iteration"] = state.iteration
    sd["consumed_samples"] = state.consumed_samples
    sd["layout"] = _layout()
    sd["distributed_optimizer"] = _is_distributed(optimizer)
    if rng is not None:
        sd["rng_state"] = _sharded_rng(rng)
    return sd


def save_checkpoint(root: str, chunks, optimizer, scheduler, state: TrainState) -> str:
    """Save model chunks, optimizer, scheduler, progress and RNG as ``root/iter_N`` atomically.

    Args:
        root: checkpoint directory (created if missing).
        chunks: DDP-wrapped model chunks of this rank (the GPTModel, ``chunk.module``, is saved
            under megatron-core's own parameter names, as Megatron-LM does).
        optimizer: megatron-core optimizer from ``get_megatron_optimizer``.
        scheduler: megatron-core ``OptimizerParamScheduler``.
        state: iteration and consumed samples.

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
    sd = _state_dict(chunks, optimizer, scheduler, state, _rng_state(), loading=False)
    dist_checkpointing.save(sd, partial, content_metadata=_SAVE_METADATA)
    dist.barrier()
    if dist.get_rank() == 0:
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.replace(partial, final)
        tmp = os.path.join(root, f"{TRACKER}.tmp")
        with open(tmp, "w") as f:
            f.write(str(state.iteration))
        os.replace(tmp, os.path.join(root, TRACKER))
    dist.barrier()
    return final


def saved_schedule(root: str) -> dict | None:
    """The scheduler state (megatron-core ``OptimizerParamScheduler.state_dict()``) of the newest
    complete checkpoint under ``root``, read from its common state without loading any tensor;
    None when ``root`` holds no checkpoint."""
    iteration = latest_iteration(root)
    if iteration is None:
        return None
    return dist_checkpointing.load_common_state_dict(checkpoint_dir(root, iteration))["scheduler"]


def load_checkpoint(root: str, chunks, optimizer, scheduler) -> TrainState | None:
    """Resume from the newest complete checkpoint under ``root``.

    Model and optimizer are resharded to the current layout by dist_checkpointing; RNG states
    are restored only when the TP/PP/DP layout equals the saved one.

    Returns:
        The restored progress, or None when ``root`` holds no complete checkpoint.
    """
    iteration = latest_iteration(root)
    if iteration is None:
        return None
    path = checkpoint_dir(root, iteration)
    common = dist_checkpointing.load_common_state_dict(path)
    saved_distributed = common.get("distributed_optimizer", False)
    if saved_distributed != _is_distributed(optimizer):
        raise ConfigError(
            f"use_distributed_optimizer={not saved_distributed}: {path} was saved with "
            f"use_distributed_optimizer={saved_distributed}, and megatron-core cannot convert "
            "optimizer state between the two. Fix: resume with the same setting"
        )
    same_layout = common.get("layout") == _layout()
    template = _rng_state() if same_layout else None
    _prime_torch_adam_state(optimizer)
    patch_distributed_optimizer_load()
    sd = _state_dict(chunks, optimizer, scheduler, TrainState(), template, loading=True)
    loaded = dist_checkpointing.load(sd, path)
    for i, chunk in enumerate(chunks):
        chunk.module.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"])
    optimizer.load_state_dict(loaded["optimizer"])
    if scheduler.override_opt_param_scheduler:
        # megatron-core's param groups carry their own max_lr / min_lr (the checkpoint's after
        # the load), which the scheduler prefers to its own: give them the config's.
        for group in optimizer.param_groups:
            group["max_lr"], group["min_lr"] = scheduler.max_lr, scheduler.min_lr
    scheduler.load_state_dict(loaded["scheduler"])
    if same_layout:
        _set_rng_state(loaded["rng_state"])
    return TrainState(loaded["iteration"], loaded["consumed_samples"])

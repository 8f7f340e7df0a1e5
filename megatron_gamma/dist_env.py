"""Where this process sits in the job (rank, world size, local rank), read from the launcher's
environment alone: no torch, so that commands check a layout against the world size before
importing torch and megatron-core."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int


def read_dist_env(environ: dict | None = None) -> DistEnv:
    """Rank, world size and local rank from torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``),
    else SLURM (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``), else a single
    process."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return DistEnv(
            int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0))
        )
    return DistEnv(0, 1, 0)

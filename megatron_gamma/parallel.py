"""torch.distributed and megatron-core ``parallel_state`` set-up: the only place that knows CPU vs
GPU.

Rank, world size and local rank come from torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``),
else from SLURM (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``; rendezvous on
``MASTER_ADDR``/``MASTER_PORT``), else a single process. With a GPU: cuda, and process groups
with NCCL for CUDA tensors and gloo for CPU tensors (:func:`process_group_backend`); without: cpu +
gloo, with :func:`megatron_gamma.compat.apply_cpu_compat` applied first.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from megatron_gamma.config import Config, ConfigError, validate_layout, virtual_stages
from megatron_gamma.determinism import apply_deterministic_mode
from megatron_gamma.dist_env import read_dist_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uses_gpu() -> bool:
    """True when this process trains on CUDA."""
    return torch.cuda.is_available()


def process_group_backend() -> str:
    """The ``backend`` of the default process group, inherited by megatron-core's groups.

    With a GPU ``"cuda:nccl,cpu:gloo"``: a collective on a CUDA tensor runs on NCCL, one on a CPU
    tensor (a loss summed in float64, an object gathered) on gloo, as TorchTitan does; NCCL alone
    has no CPU backend and raises "No backend type associated with device type cpu". Without a
    GPU ``"gloo"``.
    """
    return "cuda:nccl,cpu:gloo" if uses_gpu() else "gloo"


def initialize(cfg: Config) -> int:
    """Initialize torch.distributed (collectives time out after
    ``distributed_timeout_minutes``), megatron-core model parallelism and the RNGs.

    Args:
        cfg: run config (parallel layout, batch sizes, seed).

    Returns:
        The data-parallel size.

    Raises:
        ConfigError: a layout that does not fit the world size (see ``validate_layout``), or
            ``psutil`` missing (megatron-core's checkpoint writer hangs without it).
    """
    env = read_dist_env()
    dp = validate_layout(cfg, env.world_size)
    if cfg.training.deterministic_mode:
        line = apply_deterministic_mode(os.environ)  # before NCCL, cuBLAS and TE read them
        if env.rank == 0:
            print(line, flush=True)
    try:
        import psutil  # noqa: F401  (dist_checkpointing's async writer dies silently without it)
    except ImportError as e:
        raise ConfigError("psutil is not installed. Fix: pip install psutil") from e
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if env.world_size == 1:
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        elif "MASTER_PORT" not in os.environ:
            raise ConfigError("MASTER_PORT is not set. Fix: launch with torchrun or srun + sbatch")
        if uses_gpu():
            torch.cuda.set_device(env.local_rank)
        else:
            from megatron_gamma.compat import apply_cpu_compat

            apply_cpu_compat()
        dist.init_process_group(
            process_group_backend(),
            rank=env.rank,
            world_size=env.world_size,
            init_method="env://",
            timeout=datetime.timedelta(minutes=cfg.parallel.distributed_timeout_minutes),
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=cfg.parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_stages(cfg),
        context_parallel_size=cfg.parallel.context_parallel_size,
        expert_model_parallel_size=cfg.parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=cfg.parallel.expert_tensor_parallel_size,
        distributed_timeout_minutes=cfg.parallel.distributed_timeout_minutes,
    )
    seed = cfg.training.seed
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return dp


# Dense bf16 tensor-core peak (TFLOP/s) by device name, for MFU in the training logs.
_PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "A800": 312.0, "H800": 989.0}


def peak_tflops() -> float | None:
    """Peak dense bf16 TFLOP/s of this process's GPU, or None (CPU or unknown device)."""
    if not uses_gpu():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in _PEAK_BF16_TFLOPS.items() if k in name), None)


def memory_stats() -> dict[str, float]:
    """This process's memory in GiB: ``mem_allocated_gib`` and ``mem_reserved_gib`` (the CUDA
    caching allocator's, ``torch.cuda.memory_allocated/reserved``) on GPU, ``mem_rss_gib``
    (resident set size, from psutil) on CPU."""
    if uses_gpu():
        return {
            "mem_allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "mem_reserved_gib": torch.cuda.memory_reserved() / 2**30,
        }
    import psutil

    return {"mem_rss_gib": psutil.Process().memory_info().rss / 2**30}


def destroy() -> None:
    """Tear down model parallelism and the process group."""
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()

"""Collectives on a GPU run: the process group has NCCL for CUDA tensors and gloo for CPU tensors
(``parallel.process_group_backend``), so a collective on a CPU tensor works there too.

No GPU here: NCCL is stood in for by a backend registered for the ``cuda`` device type only (a gloo
backend under another name). A process group made of it alone, as ``nccl`` alone was, has no
backend for CPU tensors and raises "No backend type associated with device type cpu" at the first
CPU collective, as NCCL alone does on a GPU machine.
"""

import datetime
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from distributed import run_distributed

from megatron_gamma import parallel
from megatron_gamma.config import load_config

CUDA_ONLY = "cudaonlytest"


def _cuda_only_backend(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class _Stop(Exception):
    """Raised by the patched init_process_group once it has seen its arguments."""


def test_backend_choice_follows_uses_gpu(monkeypatch):
    monkeypatch.setattr(parallel, "uses_gpu", lambda: False)
    assert parallel.process_group_backend() == "gloo"
    monkeypatch.setattr(parallel, "uses_gpu", lambda: True)
    assert parallel.process_group_backend() == "cuda:nccl,cpu:gloo"
    seen = {}

    def init_process_group(backend, **kwargs):
        seen.update(kwargs, backend=backend)
        raise _Stop

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.update(device=device))
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    # parallel.initialize sets these for a single process; monkeypatch restores them after.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(_Stop):
        parallel.initialize(load_config([], {}))
    assert seen["backend"] == "cuda:nccl,cpu:gloo"
    assert seen["device"] == 0 and seen["world_size"] == 1
    assert seen["timeout"] == datetime.timedelta(minutes=10)


def _gpu_style_group_runs_cpu_collectives() -> dict:
    """One rank: initialize as on a GPU (uses_gpu() patched True, NCCL replaced by the CUDA-only
    stand-in), then run the CPU collectives of the loop, the init audit and preemption."""
    from megatron.core import parallel_state

    from megatron_gamma.compat import apply_cpu_compat
    from megatron_gamma.training.loop import _reduce_loss
    from megatron_gamma.training.preemption import PreemptionGuard

    dist.Backend.register_backend(CUDA_ONLY, _cuda_only_backend, devices=["cuda"])
    init = dist.init_process_group

    def with_stand_in(backend, **kwargs):
        return init(backend.replace("nccl", CUDA_ONLY), **kwargs)

    apply_cpu_compat()  # megatron-core's RNG set-up needs it without a real GPU
    with (
        mock.patch.object(parallel, "uses_gpu", lambda: True),
        mock.patch.object(torch.cuda, "set_device", lambda device: None),
        mock.patch.object(dist, "init_process_group", with_stand_in),
    ):
        parallel.initialize(load_config([], {}))
    rank = dist.get_rank()
    loss = _reduce_loss([{"lm loss": torch.tensor(2.0 + 2.0 * rank)}])
    dp = torch.tensor([1.0 + rank])
    dist.all_reduce(dp, group=parallel_state.get_data_parallel_group())
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": rank})
    guard = PreemptionGuard(None, exit_signal_handler=False)
    guard.signalled = "SIGUSR1" if rank == 1 else None
    reason = guard._reason(torch.device("cpu"))
    return {
        "backend": dist.get_backend_config(),
        "loss": loss,
        "dp_sum": float(dp),
        "gathered": gathered,
        "reason": reason,
    }


@pytest.mark.slow
def test_cpu_collectives_work_in_a_gpu_process_group():
    results = run_distributed(_gpu_style_group_runs_cpu_collectives, 2)
    for r in results:
        assert r["backend"] == f"cuda:{CUDA_ONLY},cpu:gloo"
        assert r["loss"] == 3.0  # (2 + 4) / 2: the mean over the two data-parallel ranks
        assert r["dp_sum"] == 3.0  # 1 + 2 over megatron-core's data-parallel group
        assert r["gathered"] == [{"rank": 0}, {"rank": 1}]
        assert r["reason"] == "SIGUSR1"  # rank 1's signal reaches rank 0

"""The patches of :mod:`megatron_gamma.compat` (CPU shims, the save queue), seen from a fresh
process."""

from __future__ import annotations

import subprocess
import sys

import pytest
from distributed import run_distributed
from helpers import TINY_MODEL, run_cli

_ZERO_GRAD_OF_A_VIEW = """
import torch
from megatron.core.optimizer.optimizer import _zero_grad_group_helper
{setup}
leaf = torch.ones(4, requires_grad=True)
_zero_grad_group_helper([leaf * 2], set_to_none=True)  # a non-leaf, as a shard view is
"""


@pytest.mark.parametrize("shim", [False, True])
def test_the_devicemap_shim_drops_the_non_leaf_grad_warning_it_would_claim(shim):
    """megatron-core's ``zero_grad`` reads ``.grad`` of its distributed optimizer's shard views,
    which torch warns about: from megatron-core's optimizer.py without the shim; under the
    shim's TorchFunctionMode the read happens in compat.py, so the warning named this project's
    code (a new user's trial 3). The shim ignores it where it names compat.py."""
    setup = "from megatron_gamma.compat import apply_cpu_compat; apply_cpu_compat()" if shim else ""
    code = _ZERO_GRAD_OF_A_VIEW.format(setup=setup)
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "is not a leaf Tensor" in line]
    if shim:
        assert lines == []
    else:
        assert len(lines) == 1 and "megatron/core/optimizer/optimizer.py:" in lines[0]


@pytest.mark.slow
def test_a_distributed_optimizer_run_prints_no_library_warning(tmp_path, demo_prefix):
    """Two data-parallel processes with the distributed optimizer: every rank printed torch's
    non-leaf ``.grad`` warning naming compat.py and its FutureWarnings on the collectives
    megatron-core's gradient buffers call (a new user's trial 3); neither says anything the user
    can act on."""
    flags = ["--train-iters", "2", "--use-distributed-optimizer", "--eval-iters", "0"]
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path), *TINY_MODEL]
    proc = run_cli([*args, *flags], nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stderr, proc.stderr[-4000:]


def _save_and_load(path: str, patched: bool) -> dict:
    """One gloo rank saves a sharded tensor with megatron-core's torch_dist writer (after
    ``patch_save_results_queue`` where ``patched``) and loads it back; reports what it read,
    the type of the writer's results queue and the Manager processes this process started."""
    import multiprocessing

    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from megatron_gamma.compat import apply_cpu_compat, patch_save_results_queue

    if not torch.cuda.is_available():
        apply_cpu_compat()  # the writer synchronizes CUDA (as megatron_gamma.parallel does)
    dist.init_process_group("gloo")
    try:
        weights = torch.arange(12.0).reshape(3, 4)
        if patched:
            patch_save_results_queue()
        dist_checkpointing.save({"w": ShardedTensor.from_rank_offsets("w", weights)}, path)
        asked = {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4))}
        loaded = dist_checkpointing.load(asked, path)["w"]
        return {
            "loaded": loaded.tolist(),
            "queue": type(filesystem_async._results_queue).__module__,
            "managers": [p.name for p in multiprocessing.active_children() if "Manager" in p.name],
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("patched", [False, True])
def test_the_savequeue_patch_saves_without_a_manager_process(tmp_path, patched):
    """megatron-core's synchronous torch_dist save hands its write results back through a spawned
    Manager process's queue (a server that imports torch to unpickle them: ~5-6 CPU-s of every
    saving process); with the patch it is a ``queue.Queue`` of the saving process, no Manager
    starts, and the checkpoint reads back the same."""
    (got,) = run_distributed(_save_and_load, 1, str(tmp_path), patched)
    assert got["loaded"] == [[4.0 * r + c for c in range(4)] for r in range(3)]
    if patched:  # a megatron-core outside SAVE_QUEUE_VERSIONS fails here: read its writer first
        assert got["queue"] == "queue" and got["managers"] == []
    else:
        assert got["queue"] == "multiprocessing.managers" and len(got["managers"]) == 1

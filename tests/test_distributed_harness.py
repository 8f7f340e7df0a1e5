"""The harness of ``tests/distributed.py``: a rank's result reaches pytest after the rank exits.

Tensors put on a ``multiprocessing`` queue by torch's own pickler travel as file descriptors that
the sending process serves until it exits; a rank that had already exited when pytest read its
result failed the whole test with ``FileNotFoundError`` (CI, ``test_checkpoint_ops``).
"""

import os
import pickle

import pytest
import torch
from distributed import _child, context


def _state():
    return {"weight": torch.arange(12, dtype=torch.float64).reshape(3, 4), "step": 7}


@pytest.mark.slow
def test_a_rank_result_is_read_after_the_rank_has_exited():
    ctx = context()  # run_distributed's
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(_state, 0, 1, 0, (), queue, dict(os.environ)))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    rank, ok, value = queue.get(timeout=60)
    assert (rank, ok) == (0, True)
    got = pickle.loads(value)
    assert got["step"] == 7
    torch.testing.assert_close(got["weight"], _state()["weight"], rtol=0, atol=0)

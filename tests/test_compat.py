"""The CPU compatibility shims of :mod:`megatron_gamma.compat`, seen from a fresh process."""

from __future__ import annotations

import subprocess
import sys

import pytest
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

"""megatron-core's warnings on the console (``warnings_summary``): its advice to set
CUDA_DEVICE_MAX_CONNECTIONS, raised by the real tensor-parallel linear layer, folded into one line
on rank 0 of a GPU run and not shown on a CPU run."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from helpers import TINY_MODEL, run_cli
from megatron.core.tensor_parallel import layers

from megatron_gamma.warnings_summary import summarize_accelerator_warnings


def _advice(monkeypatch, sequence_parallel: bool) -> warnings.WarningMessage:
    """megatron-core's warning from its first tensor-parallel linear call of a process."""
    linear = layers.linear_with_grad_accumulation_and_async_allreduce
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.setattr(linear, "warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(Exception):  # sequence parallelism gathers over no TP group here
            linear(
                torch.ones(2, 3),
                torch.ones(4, 3),
                None,
                False,
                not sequence_parallel,
                sequence_parallel,
            )
    (advice,) = [w for w in caught if "CUDA_DEVICE_MAX_CONNECTIONS" in str(w.message)]
    return advice


def _show(advice: warnings.WarningMessage) -> None:
    warnings.showwarning(advice.message, advice.category, advice.filename, advice.lineno)


def _passed_on(monkeypatch) -> list:
    """What reaches the ``warnings.showwarning`` in place before the hook (Python's raw print)."""
    passed: list = []
    monkeypatch.setattr(warnings, "showwarning", lambda *shown: passed.append(shown))
    return passed


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_cuda_connections_advice_is_one_line_on_rank_0_of_a_gpu_run(
    monkeypatch, capsys, sequence_parallel
):
    advice = _advice(monkeypatch, sequence_parallel)
    passed = _passed_on(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("RANK", "1")
    summarize_accelerator_warnings()
    _show(advice)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    summarize_accelerator_warnings()
    _show(advice)
    _show(advice)
    (line,) = capsys.readouterr().err.splitlines()
    assert passed == []
    assert line.startswith("megatron-core: CUDA_DEVICE_MAX_CONNECTIONS is unset, not the 1")
    assert line.endswith(
        "Fix: export CUDA_DEVICE_MAX_CONNECTIONS=1 before the launch (megatron-gamma submit does "
        "so under tensor or sequence parallelism)"
    )


def test_cuda_connections_advice_is_not_shown_on_a_cpu_run(monkeypatch, capsys):
    advice = _advice(monkeypatch, sequence_parallel=False)
    passed = _passed_on(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    summarize_accelerator_warnings()
    _show(advice)
    assert capsys.readouterr().err == "" and passed == []


@pytest.mark.slow
def test_a_two_process_tensor_parallel_cpu_run_folds_megatron_cores_warnings(demo_prefix, tmp_path):
    args = ["pretrain", "--data-path", demo_prefix, "--run-dir", str(tmp_path / "run")]
    args += [*TINY_MODEL, "--train-iters", "2", "--tensor-model-parallel-size", "2"]
    proc = run_cli(args, nproc=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in proc.stderr, proc.stderr[-4000:]
    assert len([line for line in proc.stderr.splitlines() if "not installed" in line]) == 1

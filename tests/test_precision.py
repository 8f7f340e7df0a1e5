"""Precision flags: --fp16 is refused by name without CUDA (and trains and resumes on a GPU),
the loss-scaling flags reach megatron-core's OptimizerConfig, gradients are reduced in fp32 as
Megatron-LM does, and the fp16 warning for the paper's epsilon states a measured fact."""

import math

import pytest
import torch
from helpers import run_cli
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig as McoreOptimizerConfig

from megatron_gamma import ops
from megatron_gamma.config import ConfigError, load_config
from megatron_gamma.training.precision import (
    check_precision,
    fp16_epsilon_warning,
    grad_reduce_in_fp32,
    loss_scaling,
)


def test_fp16_is_refused_by_name_without_cuda():
    cfg = load_config(None, {"fp16": True})
    with pytest.raises(ConfigError, match=r"fp16=True: needs CUDA.*device='cuda'.*Fix:"):
        check_precision(cfg, on_gpu=False)
    check_precision(cfg, on_gpu=True)
    check_precision(load_config(None, {}), on_gpu=False)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal; a GPU trains fp16")
def test_cli_refuses_fp16_on_cpu(tmp_path, demo_prefix):
    proc = run_cli(
        [
            "pretrain",
            "--data-path",
            demo_prefix,
            "--split",
            "95,5,0",
            "--run-dir",
            str(tmp_path),
            "--fp16",
        ]
    )
    assert proc.returncode == 2 and "fp16=True: needs CUDA" in proc.stderr, proc.stderr[-2000:]


def test_loss_scaling_reaches_megatron_core():
    cfg = load_config(
        None,
        {
            "fp16": True,
            "initial_loss_scale": 2.0**16,
            "min_loss_scale": 4.0,
            "loss_scale_window": 50,
            "hysteresis": 3,
        },
    )
    mc = McoreOptimizerConfig(**loss_scaling(cfg))
    assert (mc.fp16, mc.loss_scale, mc.initial_loss_scale) == (True, None, 2.0**16)
    assert (mc.min_loss_scale, mc.loss_scale_window, mc.hysteresis) == (4.0, 50, 3)
    static = McoreOptimizerConfig(**loss_scaling(cfg.replace(loss_scale=1024.0)))
    assert static.loss_scale == 1024.0
    # megatron-core would apply a static scale to bf16 too; the flag counts with fp16 only
    assert loss_scaling(load_config(None, {"loss_scale": 8.0, "bf16": True}))["loss_scale"] is None


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, True),
        ({"bf16": True}, True),
        ({"bf16": True, "accumulate_allreduce_grads_in_fp32": False}, True),
        ({"fp16": True}, False),
        ({"fp16": True, "accumulate_allreduce_grads_in_fp32": True}, True),
    ],
)
def test_grad_reduce_in_fp32_as_megatron(overrides, expected):
    value = grad_reduce_in_fp32(load_config(None, overrides))
    assert value is expected
    assert DistributedDataParallelConfig(grad_reduce_in_fp32=value).grad_reduce_in_fp32 is expected


def test_fp16_epsilon_warning_states_what_is_measured():
    """The warning's claim, measured on our RMSNorm against fp64: eps = 1e-12 is held in fp32
    (the forward of a row with RMS 1e-6, where mean(x^2) ~ eps, matches fp64; in fp16 eps would
    be 0), but the fp16 input gradient of that row with dy * w = 0.1 overflows to inf exactly as
    the fp64 gradient exceeds 65504, while eps = 1e-5 caps it near 0.1 / sqrt(1e-5) = 31.6."""
    line = fp16_epsilon_warning(load_config(None, {"fp16": True}))
    assert line.startswith("norm_epsilon=1e-12 with fp16") and "1e+06 x dy * w" in line
    assert fp16_epsilon_warning(load_config(None, {"fp16": True, "norm_epsilon": 1e-5})) is None
    assert fp16_epsilon_warning(load_config(None, {"bf16": True})) is None

    hidden = 64
    x = torch.full((1, hidden), 1e-6, dtype=torch.float16, requires_grad=True)
    w = torch.ones(hidden, dtype=torch.float16)
    dy = torch.zeros(1, hidden, dtype=torch.float16)
    dy[0, 0] = 0.1
    for eps in (1e-12, 1e-5):
        x.grad = None
        y = ops.rms_norm(x, w, eps)
        y.backward(dy)
        x64 = x.detach().double().requires_grad_()
        y64 = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
        y64.backward(dy.double())
        assert torch.allclose(y.double(), y64, rtol=1e-3), eps
        dx, dx64 = x.grad[0, 0].double().item(), x64.grad[0, 0].item()
        if eps == 1e-12:
            assert abs(dx64) > 65504 and dx == float("inf"), (dx, dx64)
        else:
            assert dx == pytest.approx(dx64, rel=1e-3) and dx < 32, (dx, dx64)


def _fp16_runs(runs: list[dict]) -> list[dict]:
    """Train each config in turn in this process, with the run's callbacks (checkpointing among
    them), as ``pretrain`` does; return its losses and loss-scaler state."""
    from megatron_gamma.training.loop import Trainer, run_callbacks

    out = []
    for overrides in runs:
        trainer = Trainer(load_config(None, overrides))
        trainer.callbacks = run_callbacks(trainer.cfg, trainer.preemption)
        try:
            losses = trainer.train().train_losses
            optimizer = getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer])[0]
            scaler = optimizer.grad_scaler
            out.append(
                {
                    "losses": losses,
                    "scale": float(scaler.scale),
                    "growth_tracker": scaler._growth_tracker,
                    "hysteresis_tracker": scaler._hysteresis_tracker,
                    "scheduler_steps": trainer.scheduler.num_steps,
                }
            )
        finally:
            trainer.close()
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 needs CUDA (megatron-core)")
@pytest.mark.timeout(600)
def test_fp16_trains_and_its_loss_scaler_survives_a_resume(tmp_path, demo_prefix):
    from distributed import run_distributed

    common = dict(
        data_path=[demo_prefix],
        split="95,5,0",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=64,
        micro_batch_size=4,
        global_batch_size=8,
        train_iters=8,
        eval_interval=100,
        init_audit="off",
        log_diagnostics_interval=0,
        progress_bar=False,
        fp16=True,
        initial_loss_scale=2.0**20,
        loss_scale_window=3,
    )
    ck = str(tmp_path / "ck")
    runs = [
        {**common, "run_dir": str(tmp_path / "whole")},
        {**common, "run_dir": str(tmp_path / "part"), "save": ck, "exit_interval": 4},
        {**common, "run_dir": str(tmp_path / "part"), "load": ck},
    ]
    (results,) = run_distributed(_fp16_runs, 1, runs)
    whole, first, resumed = results
    assert all(math.isfinite(v) for v in whole["losses"].values())
    assert sorted(resumed["losses"]) == list(range(5, 9))
    for it in range(5, 9):
        assert resumed["losses"][it] == whole["losses"][it], it
    for key in ("scale", "growth_tracker", "hysteresis_tracker", "scheduler_steps"):
        assert resumed[key] == whole[key], key
    assert first["scale"] != 2.0**20 or first["growth_tracker"] > 0  # the scaler moved

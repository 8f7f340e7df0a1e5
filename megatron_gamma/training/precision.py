"""Mixed precision: what fp16 / bf16 ask of megatron-core, the checks before a run, and the
fp16 warning for the paper's small RMSNorm epsilon.

megatron-core's mixed-precision optimizer (``Float16OptimizerWithFloat16Params``) keeps fp32
master weights; under fp16 it scales the loss, by ``ConstantGradScaler(loss_scale)`` or
``DynamicGradScaler`` (``initial_loss_scale``, ``min_loss_scale``, ``loss_scale_window``,
``hysteresis``), skipping steps whose gradients overflow. Both scalers allocate CUDA tensors, so
fp16 needs a GPU.
"""

from __future__ import annotations

from megatron_gamma.config import Config, ConfigError

FP16_MIN_SUBNORMAL = 2.0**-24
"""Smallest positive fp16 value (5.96e-8): a smaller epsilon rounds to 0 in fp16."""
FP16_MAX = 65504.0
"""Largest finite fp16 value."""


def check_precision(cfg: Config, on_gpu: bool) -> None:
    """Refuse what this machine cannot run (before any model is built).

    Raises:
        ConfigError: ``fp16`` without CUDA (megatron-core's grad scalers and mixed-precision
            optimizer allocate ``device='cuda'`` tensors).
    """
    if cfg.training.fp16 and not on_gpu:
        raise ConfigError(
            "fp16=True: needs CUDA, and this process has none (megatron-core 0.16's "
            "DynamicGradScaler / ConstantGradScaler and Float16OptimizerWithFloat16Params "
            "allocate their scale and overflow flags with device='cuda'). Fix: train on a GPU, "
            "or drop --fp16 (fp32 on CPU)"
        )


def grad_reduce_in_fp32(cfg: Config) -> bool:
    """megatron-core DDP ``grad_reduce_in_fp32``: for bf16 unless ``--grad-reduce-in-bf16``
    (Megatron-LM forces ``--accumulate-allreduce-grads-in-fp32`` on for bf16 otherwise), as the
    flag says for fp16; for fp32 weights the gradients are fp32 either way (True keeps the
    earlier setting)."""
    t = cfg.training
    if t.bf16:
        return not t.grad_reduce_in_bf16
    return t.accumulate_allreduce_grads_in_fp32 if t.fp16 else True


def loss_scaling(cfg: Config) -> dict:
    """The loss-scaling fields of megatron-core's ``OptimizerConfig`` for ``cfg``; the loss
    scale only under fp16 (megatron-core would also apply a static one to bf16)."""
    o, fp16 = cfg.optimizer, cfg.training.fp16
    return dict(
        fp16=fp16,
        loss_scale=o.loss_scale if fp16 else None,
        initial_loss_scale=o.initial_loss_scale,
        min_loss_scale=o.min_loss_scale,
        loss_scale_window=o.loss_scale_window,
        hysteresis=o.hysteresis,
    )


def fp16_epsilon_warning(cfg: Config) -> str | None:
    """The warning for fp16 with ``norm_epsilon`` below fp16's smallest subnormal, or None.

    Our RMSNorm adds epsilon in fp32 (never cast to fp16, so it is not flushed to 0) and the
    forward pass is exact, but epsilon no longer bounds the input gradient: dx ~ dy * w / RMS(x)
    reaches dy * w / sqrt(eps) (1e6 x dy * w at 1e-12, 316 x at 1e-5), rounded once to fp16 it
    overflows to inf on rows with RMS(x) below |dy * w| / 65504, where dy carries the loss
    scale (measured in tests/test_precision.py)."""
    eps = cfg.model.norm_epsilon
    if not cfg.training.fp16 or eps >= FP16_MIN_SUBNORMAL:
        return None
    return (
        f"norm_epsilon={eps:g} with fp16: below fp16's smallest subnormal "
        f"({FP16_MIN_SUBNORMAL:.3g}). The RMSNorm adds it in fp32, so the forward pass is exact, "
        f"but it no longer caps the RMSNorm input gradient: dx ~ dy * w / RMS(x) grows up to "
        f"{eps**-0.5:.3g} x dy * w and overflows fp16 ({FP16_MAX:g}) on tokens whose hidden "
        "state has RMS(x) < |dy * w| * loss scale / 65504, as small-initialized hidden states do; "
        "the dynamic loss scaler then skips those steps and lowers the scale. Use --bf16 to keep "
        "the paper's epsilon without this, or accept skipped steps"
    )

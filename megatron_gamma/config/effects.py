"""Settings that a run was given but that have no effect under its other settings.

Each rule names the setting that would make the value count, e.g. ``init_method_std=0.006: no
effect under init_method='gamma'; it counts with --init-method normal``. Only values the user
gave (a command-line flag or a YAML key) are checked: a default that does nothing is not a
mistake. Every field of :mod:`megatron_gamma.config` is either listed in :data:`RULES` or in
:data:`ALWAYS_EFFECTIVE` (the test suite holds the two to cover every field exactly once).

The ``cluster`` section describes the SLURM shape for ``estimate`` and ``submit``: its keys
are reported for ``pretrain`` only when given as flags (recipes carry them in YAML on purpose).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from megatron_gamma.config.errors import ConfigError
from megatron_gamma.config.loading import (
    REDACTED,
    Config,
    config_from_dict,
    field_index,
    layered,
    read_yaml,
    sectioned,
    typed_value,
)
from megatron_gamma.config.megatron_lm import FUSIONS, moe_layer_pattern
from megatron_gamma.config.sections import split_shares


def _has_validation(cfg: Config) -> bool:
    d = cfg.data
    if d.mock_data:
        return True  # megatron-core's mock split is "1,1,1"
    if d.train_data_path:
        return bool(d.valid_data_path)
    return split_shares(d.split)[1] > 0


def _moe(cfg: Config) -> bool:
    return cfg.model.num_experts is not None


def _has_warmup(cfg: Config) -> bool:
    o = cfg.optimizer
    return bool(o.lr_warmup_iters or o.lr_warmup_samples or o.lr_warmup_fraction)


def _dynamic_loss_scale(cfg: Config) -> bool:
    return cfg.training.fp16 and cfg.optimizer.loss_scale is None


# field -> (is the value in effect under cfg?, the setting that makes it count)
RULES: dict[str, tuple[Callable[[Config], bool], str]] = {
    "ffn_hidden_size": (
        lambda c: (
            not _moe(c)
            or c.model.moe_ffn_hidden_size == c.model.ffn_hidden_size
            or 0 in moe_layer_pattern(c.model.moe_layer_freq, c.model.num_layers)
        ),
        "a dense model (no --num-experts), dense layers (--moe-layer-freq), or leaving "
        "--moe-ffn-hidden-size unset",
    ),
    "max_position_embeddings": (
        lambda c: c.model.position_embedding_type == "learned_absolute",
        "--position-embedding-type learned_absolute",
    ),
    "gate_bias": (lambda c: c.model.gated_attention != "none", "--gated-attention elementwise"),
    "rotary_base": (
        lambda c: c.model.position_embedding_type == "rope",
        "--position-embedding-type rope",
    ),
    "moe_router_topk": (_moe, "--num-experts"),
    "moe_ffn_hidden_size": (_moe, "--num-experts"),
    "moe_aux_loss_coeff": (_moe, "--num-experts"),
    "moe_token_dispatcher_type": (_moe, "--num-experts"),
    "init_gamma": (lambda c: c.init.init_method == "gamma", "--init-method gamma"),
    "init_gamma_overrides": (lambda c: c.init.init_method == "gamma", "--init-method gamma"),
    "embedding_fan_in": (lambda c: c.init.init_method == "gamma", "--init-method gamma"),
    "init_method_std": (lambda c: c.init.init_method == "normal", "--init-method normal"),
    "expert_tensor_parallel_size": (_moe, "--num-experts"),
    "sequence_parallel": (
        lambda c: c.parallel.tensor_model_parallel_size > 1,
        "--tensor-model-parallel-size > 1",
    ),
    "split": (
        lambda c: not c.data.train_data_path and not c.data.mock_data,
        "--data-path (not per-split paths, not --mock-data)",
    ),
    "min_lr": (lambda c: c.optimizer.lr_decay_style != "constant", "a decaying --lr-decay-style"),
    "lr_decay_iters": (
        lambda c: c.optimizer.lr_decay_style != "constant",
        "a decaying --lr-decay-style",
    ),
    "adam_beta1": (lambda c: c.optimizer.optimizer == "adam", "--optimizer adam"),
    "adam_beta2": (lambda c: c.optimizer.optimizer == "adam", "--optimizer adam"),
    "adam_eps": (lambda c: c.optimizer.optimizer == "adam", "--optimizer adam"),
    "override_opt_param_scheduler": (lambda c: bool(c.checkpoint.load), "--load"),
    "use_checkpoint_opt_param_scheduler": (lambda c: bool(c.checkpoint.load), "--load"),
    "eval_interval": (
        lambda c: _has_validation(c) and c.training.eval_iters > 0,
        "a validation split (--split with valid > 0) and --eval-iters > 0",
    ),
    "eval_iters": (_has_validation, "a validation split (--split with valid > 0)"),
    "recompute_method": (
        lambda c: c.training.recompute_granularity == "full",
        "--recompute-granularity full",
    ),
    "recompute_num_layers": (
        lambda c: c.training.recompute_granularity == "full",
        "--recompute-granularity full",
    ),
    "save_interval": (lambda c: bool(c.checkpoint.save), "--save"),
    "save_optim": (lambda c: bool(c.checkpoint.save), "--save"),
    "save_retain_last": (lambda c: bool(c.checkpoint.save), "--save"),
    "save_retain_interval": (
        lambda c: bool(c.checkpoint.save and c.checkpoint.save_retain_last),
        "--save with --save-retain-last",
    ),
    "load_optim": (
        lambda c: bool(c.checkpoint.load) and not c.checkpoint.finetune,
        "--load (without --finetune)",
    ),
    "load_rng": (
        lambda c: bool(c.checkpoint.load) and not c.checkpoint.finetune,
        "--load (without --finetune)",
    ),
    "dist_ckpt_strictness": (
        lambda c: bool(c.checkpoint.load or c.checkpoint.pretrained_checkpoint),
        "--load or --pretrained-checkpoint",
    ),
    "slurm_nodes": (lambda c: False, "megatron-gamma estimate / submit"),
    "slurm_gpus_per_node": (lambda c: False, "megatron-gamma estimate / submit"),
    "gpu_memory_gb": (lambda c: False, "megatron-gamma estimate"),
    "env": (lambda c: False, "megatron-gamma submit"),
    "group_query_attention": (
        lambda c: c.model.num_query_groups < c.model.num_attention_heads,
        "--num-query-groups below --num-attention-heads (or leaving it unset)",
    ),
    "use_rotary_position_embeddings": (
        lambda c: False,
        "nothing: rope is already the default --position-embedding-type",
    ),
    "rotary_percent": (
        lambda c: c.model.position_embedding_type == "rope",
        "--position-embedding-type rope",
    ),
    "add_qkv_bias": (
        lambda c: not c.model.add_bias_linear,
        "--no-add-bias-linear (--add-bias-linear already gives linear_qkv, like every linear "
        "layer, a bias)",
    ),
    "disable_bias_linear": (
        lambda c: False,
        "nothing: megatron-gamma's linear layers have no bias unless --add-bias-linear",
    ),
    "attention_backend": (
        lambda c: c.model.transformer_impl == "transformer_engine",
        "--transformer-impl transformer_engine (the local backend always runs torch SDPA)",
    ),
    "use_mcore_models": (
        lambda c: False,
        "nothing: megatron-gamma always builds megatron-core models",
    ),
    "attention_softmax_in_fp32": (
        lambda c: False,
        "nothing: the attention softmax always runs in fp32",
    ),
    "distributed_backend": (
        lambda c: False,
        "nothing: the backend follows the device (NCCL for GPU tensors, gloo for CPU ones)",
    ),
    "log_timers_to_tensorboard": (
        lambda c: False,
        "nothing: no per-phase timers are kept (each log interval's ms/iter and throughput go "
        "to the console and TensorBoard's throughput/*, unless --no-log-throughput)",
    ),
    "timing_log_level": (
        lambda c: False,
        "nothing: no per-phase timers are kept (each log interval's ms/iter and throughput go "
        "to the console and TensorBoard's throughput/*, unless --no-log-throughput)",
    ),
    "fp8_recipe": (lambda c: c.model.fp8_format is not None, "--fp8-format"),
    "weight_decay": (
        lambda c: c.optimizer.weight_decay_incr_style == "constant",
        "--weight-decay-incr-style constant (linear and cosine take --start-weight-decay and "
        "--end-weight-decay)",
    ),
    "lr_decay_samples": (
        lambda c: c.optimizer.lr_decay_style != "constant",
        "a decaying --lr-decay-style",
    ),
    "lr_warmup_init": (_has_warmup, "a warmup (--lr-warmup-iters, -samples or -fraction)"),
    "lr_wsd_decay_style": (lambda c: c.optimizer.lr_decay_style == "WSD", "--lr-decay-style WSD"),
    "lr_wsd_decay_iters": (lambda c: c.optimizer.lr_decay_style == "WSD", "--lr-decay-style WSD"),
    "lr_wsd_decay_samples": (
        lambda c: c.optimizer.lr_decay_style == "WSD",
        "--lr-decay-style WSD",
    ),
    "loss_scale": (lambda c: c.training.fp16, "--fp16"),
    "initial_loss_scale": (_dynamic_loss_scale, "--fp16 without --loss-scale"),
    "min_loss_scale": (_dynamic_loss_scale, "--fp16 without --loss-scale"),
    "loss_scale_window": (_dynamic_loss_scale, "--fp16 without --loss-scale"),
    "hysteresis": (_dynamic_loss_scale, "--fp16 without --loss-scale"),
    "accumulate_allreduce_grads_in_fp32": (
        lambda c: c.training.fp16,
        "--fp16 (bf16 always accumulates and all-reduces in fp32, fp32 runs have fp32 gradients)",
    ),
    "moe_router_load_balancing_type": (_moe, "--num-experts"),
    "moe_router_score_function": (_moe, "--num-experts"),
    "moe_layer_freq": (_moe, "--num-experts"),
    "moe_pad_expert_input_to_capacity": (_moe, "--num-experts"),
    "log_validation_ppl_to_tensorboard": (
        _has_validation,
        "a validation split (--split with valid > 0)",
    ),
    "wandb_exp_name": (lambda c: c.logging.wandb_project is not None, "--wandb-project"),
    "wandb_save_dir": (lambda c: c.logging.wandb_project is not None, "--wandb-project"),
    "profile_step_start": (lambda c: c.logging.profile, "--profile"),
    "profile_step_end": (lambda c: c.logging.profile, "--profile"),
    "profile_ranks": (lambda c: c.logging.profile, "--profile"),
    "use_pytorch_profiler": (lambda c: c.logging.profile, "--profile"),
    "create_attention_mask_in_dataloader": (
        lambda c: False,
        "nothing: the causal mask is implicit in the attention kernel (a mask is built only for "
        "--reset-attention-mask)",
    ),
    "ckpt_format": (lambda c: False, "nothing: checkpoints are always torch_dist"),
    **{
        key: (lambda c: False, "nothing: megatron-gamma builds every model with this fusion off")
        for key in FUSIONS
    },
    "grad_reduce_in_bf16": (lambda c: c.training.bf16, "--bf16"),
    "sgd_momentum": (lambda c: c.optimizer.optimizer == "sgd", "--optimizer sgd"),
    "manual_gc_interval": (lambda c: c.training.manual_gc, "--manual-gc"),
    "manual_gc_eval": (lambda c: c.training.manual_gc, "--manual-gc"),
    "reset_position_ids": (
        lambda c: c.model.position_embedding_type == "learned_absolute",
        "--position-embedding-type learned_absolute (megatron-core's RoPE ignores position ids)",
    ),
}

# Fields whose value always changes a pretraining run (given a valid config).
ALWAYS_EFFECTIVE = frozenset(
    """num_layers hidden_size num_attention_heads num_query_groups kv_channels seq_length
    normalization norm_epsilon swiglu gated_attention add_bias_linear position_embedding_type
    untie_embeddings_and_output_weights hidden_dropout attention_dropout
    make_vocab_size_divisible_by vocab_size num_experts init_method tensor_model_parallel_size
    pipeline_model_parallel_size num_layers_per_virtual_pipeline_stage expert_model_parallel_size
    use_distributed_optimizer overlap_grad_reduce data_path train_data_path valid_data_path
    test_data_path tokenizer_model data_cache_path optimizer lr lr_decay_style lr_warmup_iters
    clip_grad micro_batch_size global_batch_size train_iters seed bf16
    exit_interval exit_duration_in_mins recompute_granularity save load run_dir log_interval
    tensorboard_dir progress_bar log_diagnostics_interval layer_spec exit_signal_handler finetune
    check_for_nan_in_loss_and_grad
    pretrained_checkpoint async_save init_audit overwrite
    qk_layernorm apply_layernorm_1p transformer_impl fp8_format
    lr_warmup_fraction lr_warmup_samples weight_decay_incr_style start_weight_decay
    end_weight_decay train_samples rampup_batch_size fp16
    moe_z_loss_coeff moe_shared_expert_intermediate_size moe_expert_capacity_factor
    moe_grouped_gemm moe_router_dtype recompute_activations recompute_modules
    tensorboard_log_interval log_throughput log_memory_to_tensorboard log_params_norm
    log_num_zeros_in_grad wandb_project profile
    virtual_pipeline_model_parallel_size overlap_param_gather distributed_timeout_minutes
    context_parallel_size num_workers reset_attention_mask eod_mask_loss mock_data tokenizer_type
    vocab_file merge_file num_virtual_stages_per_pipeline_rank
    mmap_bin_files manual_gc num_dataset_builder_threads deterministic_mode""".split()
)

_NEVER = "nothing: "
"""Prefix of a RULES reason for a Megatron-LM flag accepted for launch scripts that never
changes a run (it sets a default); the warning then gives the reason alone."""

_CLUSTER_KEYS = frozenset(("slurm_nodes", "slurm_gpus_per_node", "gpu_memory_gb", "env"))


def given_keys(paths: str | list[str] | None, overrides: dict) -> dict[str, str]:
    """{field name: 'flag' or 'yaml'} for every value the user gave (flags win).

    Every flag counts (a flag typed at its default value was meant). A YAML key counts only
    where its value is not the one the field takes without it: its default, or, for a field
    whose default is derived from the other settings (the dataclass default None:
    ``ffn_hidden_size``, ``max_position_embeddings``, ``train_iters``, ...), the value it
    derives to. A resolved ``config.yaml`` (:func:`~megatron_gamma.config.save_config`: what
    every run records, and what ``sweep`` launches ``pretrain`` on) writes every field, and its
    defaults are not values anyone gave.

    Args:
        paths: the ``--config`` file(s), layered in order as by :func:`load_config`.
        overrides: the command-line values, keyed by field name.
    """
    layers = [read_yaml(path) for path in ([paths] if isinstance(paths, str) else paths or [])]
    layers = [{s: values or {} for s, values in layer.items()} for layer in layers]
    flags = sectioned(overrides)
    index = field_index()
    written = {k: v for layer in layers for values in layer.values() for k, v in values.items()}
    full = config_from_dict(layered([*layers, flags])) if written else None
    out = {}
    for key, value in written.items():
        section, f, hint = index[key]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if key in overrides or typed_value(f"{section}.", key, value, hint) == default:
            continue
        if default is None:  # derived from the other settings, maybe to this very value
            without = [{s: {k: v for k, v in vals.items() if k != key} for s, vals in layer.items()}
                       for layer in layers]  # fmt: skip
            try:
                derived = getattr(
                    getattr(config_from_dict(layered([*without, flags])), section), key
                )
            except ConfigError:
                derived = None  # the other settings need the key: it was given
            if derived == getattr(getattr(full, section), key):
                continue
        out[key] = "yaml"
    out.update({key: "flag" for key in overrides})
    return out


def no_effect_warnings(cfg: Config, given: dict[str, str]) -> list[str]:
    """One line per given value that has no effect under ``cfg``'s other settings:
    ``KEY=VALUE: no effect under these settings; it counts with SETTING``, or for a flag that
    never changes a run, ``KEY=VALUE: no effect: REASON``.

    Args:
        cfg: the validated run config.
        given: {field name: 'flag' or 'yaml'}, e.g. from :func:`given_keys`.
    """
    index = field_index()
    lines = []
    for key, source in given.items():
        if key not in RULES or (key in _CLUSTER_KEYS and source != "flag"):
            continue
        effective, needs = RULES[key]
        if effective(cfg):
            continue
        value = getattr(getattr(cfg, index[key][0]), key)
        if key == "env":  # the values may be secrets
            value = dict.fromkeys(value, REDACTED)
        if needs.startswith(_NEVER):
            lines.append(f"{key}={value!r}: no effect: {needs[len(_NEVER) :]}")
        else:
            lines.append(f"{key}={value!r}: no effect under these settings; it counts with {needs}")
    return lines

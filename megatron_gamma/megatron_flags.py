"""Megatron-LM flags that ``megatron-gamma pretrain`` refuses, each with the reason and the fix.

A Megatron-LM launch script keeps working when its entry point is swapped for ``megatron-gamma
pretrain`` (or ``tools/pretrain_gpt.py``): every Megatron-LM flag is either a config field of
:mod:`megatron_gamma.config` (same name, same meaning), or listed here, so that it stops the run
before any work with one line per flag saying why and what to do, never with a bare
"unrecognized arguments" and never silently ignored. ``docs/megatron-flags.md`` lists every
Megatron-LM flag we accept or refuse; ``tests/test_megatron_flags.py`` holds it equal to this
table and to the parser.
"""

from __future__ import annotations

_NO_TE = "needs Transformer Engine and a GPU, which megatron-gamma's local spec does not use"

# Megatron-LM flag -> (why it is refused, the fix).
REFUSED: dict[str, tuple[str, str]] = {
    "--use-legacy-models": (
        "megatron-gamma builds megatron-core GPTModel only (the legacy model is deprecated)",
        "drop the flag",
    ),
    "--spec": (
        "layer specs are chosen by --transformer-impl and --layer-spec",
        "drop it and use --layer-spec gamma or local",
    ),
    "--yaml-cfg": ("megatron-gamma's YAML configs have their own layout", "use --config FILE.yaml"),
    "--use-flash-attn": (
        "deprecated in Megatron-LM in favour of --attention-backend flash",
        "use --attention-backend flash (Transformer Engine and a GPU)",
    ),
    "--tp-comm-overlap": (f"userbuffer overlap {_NO_TE}", "drop the flag"),
    "--fp8-amax-history-len": (
        "the fp8 recipe is Transformer Engine's default for --fp8-format",
        "drop the flag",
    ),
    "--fp8-amax-compute-algo": (
        "the fp8 recipe is Transformer Engine's default for --fp8-format",
        "drop the flag",
    ),
    "--fp8-param-gather": (
        "fp8 parameters are not supported (the init audit and diagnostics read fp32/bf16 weights)",
        "drop the flag",
    ),
    "--cross-entropy-loss-fusion": (
        "the loss is megatron-core's vocab-parallel cross entropy, unfused",
        "drop the flag",
    ),
    "--calculate-per-token-loss": (
        "losses are averaged per micro-batch then over micro-batches (Megatron-LM's default)",
        "drop the flag",
    ),
    "--decoupled-lr": (
        "one learning rate for all parameters (the paper's setting)",
        "drop the flag and its --decoupled-min-lr",
    ),
    "--decoupled-min-lr": (
        "one learning rate for all parameters (the paper's setting)",
        "drop the flag and its --decoupled-lr",
    ),
    "--empty-unused-memory-level": (
        "the CUDA caching allocator's cache is not emptied between iterations",
        "drop the flag",
    ),
    "--tiktoken-pattern": (
        "TikTokenizer is not supported (tokenizers are HF tokenizer.json or GPT-2 BPE files)",
        "drop the flag",
    ),
    "--log-timers-to-tensorboard": (
        "megatron-gamma has no per-phase timers; throughput/ms_per_iter is logged",
        "drop the flag",
    ),
    "--timing-log-level": (
        "megatron-gamma has no per-phase timers; throughput/ms_per_iter is logged",
        "drop the flag",
    ),
    "--log-world-size-to-tensorboard": (
        "the world size is in config.yaml and the run's first log lines",
        "drop the flag",
    ),
    "--use-cpu-initialization": (
        "gamma-init draws each rank's shard where it lives, CPU without a GPU (counter-based, "
        "layout-independent); --init-method normal follows megatron-core's device choice",
        "drop the flag",
    ),
    "--init-method-xavier-uniform": (
        "initialization is --init-method gamma (sigma = fan_in^-gamma) or normal",
        "use --init-method gamma --init-gamma 0.5 for the Xavier-like baseline",
    ),
    "--distributed-backend": (
        "the backend follows the device: nccl on GPU, gloo on CPU",
        "drop the flag",
    ),
    "--use-torch-fsdp2": (
        "FSDP is not supported; shard the optimizer state with --use-distributed-optimizer",
        "drop the flag",
    ),
    "--use-custom-fsdp": (
        "FSDP is not supported; shard the optimizer state with --use-distributed-optimizer",
        "drop the flag",
    ),
    "--overlap-p2p-communication": (
        "pipeline p2p is megatron-core's default (batched on GPU, unbatched on CPU)",
        "drop the flag",
    ),
    "--decoder-first-pipeline-num-layers": (
        "pipeline stages hold equal layer counts",
        "drop it and choose num_layers divisible by the pipeline size",
    ),
    "--decoder-last-pipeline-num-layers": (
        "pipeline stages hold equal layer counts",
        "drop it and choose num_layers divisible by the pipeline size",
    ),
    "--pipeline-model-parallel-layout": (
        "pipeline stages hold equal layer counts",
        "drop it and choose num_layers divisible by the pipeline size",
    ),
    "--account-for-embedding-in-pipeline-split": (
        "pipeline stages hold equal layer counts",
        "drop the flag",
    ),
    "--account-for-loss-in-pipeline-split": (
        "pipeline stages hold equal layer counts",
        "drop the flag",
    ),
    "--multi-latent-attention": (
        "the gated-attention spec is built on megatron-core's SelfAttention, not MLA",
        "drop the flag",
    ),
    "--mtp-num-layers": ("multi-token prediction is not supported", "drop the flag"),
    "--use-checkpoint-args": (
        "the architecture comes from the config; checkpoints are checked against it on load",
        "pass the run's config.yaml with --config",
    ),
    "--exit-on-missing-checkpoint": (
        "a missing --load checkpoint starts from iteration 0 (a requeued first attempt)",
        "check the path, or use --finetune (which needs the checkpoint)",
    ),
    "--no-save-rng": (
        "checkpoints always carry the RNG states (bitwise resume)",
        "drop the flag; --no-load-rng skips them on load",
    ),
    "--use-dist-ckpt": (
        "deprecated in Megatron-LM; checkpoints are always megatron-core dist_checkpointing",
        "drop the flag",
    ),
    "--auto-detect-ckpt-format": (
        "checkpoints are always torch_dist (megatron-core dist_checkpointing)",
        "drop the flag",
    ),
    "--ckpt-fully-parallel-save": (
        "megatron-core's default save strategy is used",
        "drop the flag",
    ),
    "--ckpt-fully-parallel-load": (
        "megatron-core's default load strategy is used",
        "drop the flag",
    ),
    "--dataloader-type": (
        "the data order is Megatron-LM's 'single' pretraining sampler (exact resume)",
        "drop the flag",
    ),
    "--rerun-mode": ("megatron-core's rerun state machine is not used", "drop the flag"),
    "--check-weight-hash-across-dp-replicas-interval": (
        "not implemented; the parity tests check replicas bitwise",
        "drop the flag",
    ),
    "--no-check-for-nan-in-loss-and-grad": (
        "not implemented: a NaN loss shows in the log line and the diagnostics",
        "drop the flag",
    ),
    "--use-rope-scaling": ("Llama-3.1 RoPE scaling is not supported", "drop the flag"),
    "--rope-scaling-factor": ("Llama-3.1 RoPE scaling is not supported", "drop the flag"),
    "--no-position-embedding": (
        "the position encoding is --position-embedding-type rope or learned_absolute",
        "drop the flag",
    ),
    "--fp32-residual-connection": (
        "the residual stream is in params_dtype (fp32, or bf16 with --bf16)",
        "drop the flag",
    ),
    "--apply-query-key-layer-scaling": (
        "attention scores are scaled by 1/sqrt(kv_channels) in fp32 softmax",
        "drop the flag",
    ),
    "--attention-softmax-in-fp32": (
        "the attention softmax always runs in fp32 (SDPA / megatron-core's unfused path)",
        "drop the flag",
    ),
    "--tensorboard-queue-size": ("TensorBoard's default queue is used", "drop the flag"),
    "--log-straggler": ("straggler detection is not supported", "drop the flag"),
    "--log-energy": ("energy monitoring is not supported", "drop the flag"),
    "--ddp-bucket-size": ("megatron-core's default DDP bucket size is used", "drop the flag"),
    "--ddp-average-in-collective": (
        "gradients are averaged by megatron-core's default path",
        "drop the flag",
    ),
    "--defer-embedding-wgrad-compute": (f"this overlap {_NO_TE}", "drop the flag"),
    "--non-persistent-save-interval": (
        "non-persistent (local) checkpoints are not supported",
        "use --save-interval with --save-retain-last",
    ),
}


def refused_flags(unknown: list[str]) -> list[str]:
    """One line per refused Megatron-LM flag among ``unknown`` (arguments argparse did not
    recognize), in order: ``--flag: refused: why. Fix: ...``. ``--flag=value`` counts as
    ``--flag``; other unknown arguments are left to argparse's message."""
    lines = []
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        if flag in REFUSED:
            why, fix = REFUSED[flag]
            lines.append(f"{flag}: refused: {why}. Fix: {fix}")
    return list(dict.fromkeys(lines))

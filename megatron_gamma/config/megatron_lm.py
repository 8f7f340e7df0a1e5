"""Megatron-LM's flags translated: the alias flags resolved into the fields they set, the
Megatron-LM model-flag combinations checked, ``--moe-layer-freq`` read, and the flags that
``megatron-gamma pretrain`` refuses, each with the reason and the fix.

A Megatron-LM launch script keeps working when its entry point is swapped for ``megatron-gamma
pretrain`` (or ``tools/pretrain_gpt.py``): every Megatron-LM flag is either a config field of
:mod:`megatron_gamma.config` (same name, same meaning), or listed in :data:`REFUSED`, so that it
stops the run before any work with one line per flag saying why and what to do, never with a bare
"unrecognized arguments" and never silently ignored. ``docs/megatron-flags.md`` lists every
Megatron-LM flag we accept or refuse; ``tests/test_megatron_flags.py`` holds it equal to this
table and to the parser.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from megatron_gamma.config.errors import fail, resolve


def resolve_megatron_aliases(m: Any) -> None:
    """Resolve Megatron-LM's alias flags of a ModelConfig into the fields they set (validation
    step, before the num_query_groups default).

    Raises:
        ConfigError: an alias that contradicts the field it sets.
    """
    if m.group_query_attention and m.num_query_groups is None:
        resolve(m, "num_query_groups", 1)
    if m.group_query_attention is False and m.num_query_groups not in (
        None,
        m.num_attention_heads,
    ):
        fail(
            "group_query_attention",
            False,
            f"contradicts num_query_groups={m.num_query_groups} (below num_attention_heads="
            f"{m.num_attention_heads}: grouped-query attention)",
            "drop --no-group-query-attention, or --num-query-groups",
        )
    if m.use_rotary_position_embeddings and m.position_embedding_type != "rope":
        fail(
            "use_rotary_position_embeddings",
            True,
            f"contradicts position_embedding_type={m.position_embedding_type!r}",
            "drop one of the two flags",
        )
    if m.disable_bias_linear and m.add_bias_linear:
        fail(
            "disable_bias_linear",
            True,
            "contradicts add_bias_linear=True",
            "drop one of --disable-bias-linear and --add-bias-linear",
        )


def check_megatron_model_flags(m: Any) -> None:
    """Value and combination checks of the Megatron-LM model flags of a ModelConfig (after
    kv_channels is resolved). Whether Transformer Engine and an FP8 GPU are present is checked
    where the model is built (:func:`megatron_gamma.model.te_backend.check_backend`), so that a
    config for a GPU cluster still validates on a login node.

    Raises:
        ConfigError: rotary_percent outside (0, 1] or rotating an odd number of channels (an
            odd head dimension, named as such); a flag the chosen backend or layer spec cannot
            honor.
    """
    if not 0.0 < m.rotary_percent <= 1.0:
        fail("rotary_percent", m.rotary_percent, "must lie in (0, 1]", "use e.g. 0.5 or 1.0")
    rotated = int(m.kv_channels * m.rotary_percent)
    rope = m.position_embedding_type == "rope"
    if rope and m.rotary_percent == 1.0 and m.kv_channels % 2:
        h, n = m.hidden_size, m.num_attention_heads
        step = 2 * n
        lower = (h // step) * step
        sizes = " or ".join(f"--hidden-size {x}" for x in (lower, lower + step) if x > 0)
        fail(
            "kv_channels",
            m.kv_channels,
            f"an odd head dimension (hidden_size {h} / num_attention_heads {n}, unless "
            "--kv-channels set it); RoPE rotates channel pairs",
            f"make it even: {sizes} with {n} heads, or an even --kv-channels",
        )
    if rope and (rotated < 2 or rotated % 2):
        fail(
            "rotary_percent",
            m.rotary_percent,
            f"rotates int(kv_channels={m.kv_channels} x rotary_percent) = {rotated} channels; "
            "RoPE rotates channel pairs",
            "choose rotary_percent so that kv_channels x rotary_percent is an even integer >= 2",
        )
    if m.apply_layernorm_1p and m.layer_spec == "local" and m.transformer_impl == "local":
        fail(
            "apply_layernorm_1p",
            True,
            "megatron-core's stock local spec normalizes with torch's RMSNorm, which has no "
            "zero-centered weight",
            "use --layer-spec gamma (our RMSNorm honors it) or --transformer-impl "
            "transformer_engine",
        )
    te = m.transformer_impl == "transformer_engine"
    if m.attention_backend in ("flash", "fused") and not te:
        fail(
            "attention_backend",
            m.attention_backend,
            "a Transformer Engine attention kernel; the local backend runs torch SDPA",
            "add --transformer-impl transformer_engine, or use --attention-backend auto",
        )
    if m.attention_backend == "local" and te:
        fail(
            "attention_backend",
            "local",
            "megatron-core's local attention is the local backend's, not Transformer Engine's",
            "use --transformer-impl local, or --attention-backend auto",
        )
    if m.fp8_format is not None and not te:
        fail(
            "fp8_format",
            m.fp8_format,
            "FP8 GEMMs are Transformer Engine's",
            "add --transformer-impl transformer_engine, or drop --fp8-format",
        )


# ModelConfig field of a Megatron-LM fusion switch -> megatron-core TransformerConfig field.
FUSIONS: dict[str, str] = {
    "masked_softmax_fusion": "masked_softmax_fusion",
    "bias_gelu_fusion": "bias_activation_fusion",
    "bias_swiglu_fusion": "bias_activation_fusion",
    "bias_dropout_fusion": "bias_dropout_fusion",
    "gradient_accumulation_fusion": "gradient_accumulation_fusion",
    "rope_fusion": "apply_rope_fusion",
    "persist_layer_norm": "persist_layer_norm",
}


def check_fusions(m: Any) -> None:
    """Megatron-LM's fusion switches of a ModelConfig: megatron-gamma builds its models with
    every megatron-core fusion off, so the ``--no-...`` flags say what already happens and a
    switch turned on is refused.

    Raises:
        ConfigError: a fusion switch set to True.
    """
    for key in FUSIONS:
        if getattr(m, key):
            flag = "--" + key.replace("_", "-")
            fail(
                key,
                True,
                "megatron-gamma builds every model with megatron-core's fusions off (the unfused "
                "paths run on CPU and GPU alike, and the diagnostics read their outputs)",
                f"drop {flag} (--no-{flag[2:]} states the default)",
            )


def moe_layer_pattern(freq: str, num_layers: int) -> list[int]:
    """Megatron-LM's ``--moe-layer-freq`` as one 1 (MoE) or 0 (dense) per layer.

    Args:
        freq: an integer N (every N-th layer from layer 0 is MoE) or a Python list expression
            of 0/1 built from literals, ``+`` and ``*`` (e.g. '([0]*1+[1]*3)').
        num_layers: the model's layers.

    Raises:
        ConfigError: anything else, N < 1, or a pattern whose length is not num_layers.
    """
    text = str(freq).strip()
    if re.fullmatch(r"\d+", text):
        n = int(text)
        if n < 1:
            fail("moe_layer_freq", freq, "must be >= 1", "use 1 (every layer MoE) or more")
        return [1 if i % n == 0 else 0 for i in range(num_layers)]
    try:
        pattern = _eval_list(ast.parse(text, mode="eval").body, num_layers)
    except (SyntaxError, ValueError) as e:
        fail(
            "moe_layer_freq",
            freq,
            f"not an integer or a 0/1 list expression ({e})",
            "use e.g. 2 or '([0]*1+[1]*3)'",
        )
    if len(pattern) != num_layers or set(pattern) - {0, 1}:
        fail(
            "moe_layer_freq",
            freq,
            f"gives {pattern}: needs one 0 or 1 per layer (num_layers={num_layers})",
            f"write {num_layers} entries of 0 (dense) or 1 (MoE)",
        )
    return pattern


def _eval_list(node: ast.AST, limit: int) -> Any:
    """A list-of-int expression of literals, ``+`` and ``*`` (no names, no calls), no list in it
    longer than ``limit`` (a '[1]*999999999' would otherwise fill memory before the length
    check)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.List):
        return [_eval_list(e, limit) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _eval_list(node.left, limit), _eval_list(node.right, limit)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(left, list) or isinstance(right, list):
            items, times = (left, right) if isinstance(left, list) else (right, left)
            if not isinstance(times, int) or len(items) * times > limit:
                raise ValueError(f"a list longer than num_layers={limit}")
        return left * right
    raise ValueError(f"{ast.dump(node)[:40]} is not allowed")


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
    "--data-impl": (
        "the datasets are always Megatron's mmap indexed datasets (.bin/.idx), what --data-impl "
        "mmap chose; Megatron-LM dropped the other formats (lazy, cached) and the flag",
        "drop the flag",
    ),
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
    "--tensorboard-queue-size": ("TensorBoard's default queue is used", "drop the flag"),
    "--log-straggler": ("straggler detection is not supported", "drop the flag"),
    "--log-energy": ("energy monitoring is not supported", "drop the flag"),
    "--ddp-bucket-size": ("megatron-core's default DDP bucket size is used", "drop the flag"),
    "--ddp-average-in-collective": (
        "gradients are averaged by megatron-core's default path",
        "drop the flag",
    ),
    "--defer-embedding-wgrad-compute": (f"this overlap {_NO_TE}", "drop the flag"),
    "--encoder-seq-length": (
        "Megatron-LM's encoder-decoder name of the sequence length; a GPT model has --seq-length",
        "use --seq-length",
    ),
    "--non-persistent-save-interval": (
        "non-persistent (local) checkpoints are not supported",
        "use --save-interval with --save-retain-last",
    ),
}


# Flags of Megatron-LM's tools/preprocess_data.py that ``preprocess`` accepts at one value, at
# which they change nothing -> (the value, why), e.g. Megatron-LM's own default.
PREPROCESS_NO_EFFECT: dict[str, tuple[str, str]] = {
    "--partitions": (
        "1",
        "Megatron-LM's default, one partition: preprocess never splits its input into "
        "partition files (it parallelizes with --workers N and --num-shards N)",
    ),
}

# Flags of Megatron-LM's tools/preprocess_data.py that ``preprocess`` refuses -> (why, fix);
# one of PREPROCESS_NO_EFFECT at another value than its own.
PREPROCESS_REFUSED: dict[str, tuple[str, str]] = {
    "--partitions": (
        "input files are not split into partition files (only --partitions 1, Megatron-LM's "
        "default, is accepted); preprocess parallelizes with worker processes and shards",
        "drop it and use --workers N, or --num-shards N --shard-index I per task and "
        "`megatron-gamma merge` (README, Preprocessing at scale)",
    ),
    "--dataset-impl": (
        "the output is always Megatron's mmap indexed dataset (.bin/.idx), what --dataset-impl "
        "mmap chose; Megatron-LM dropped the other formats (lazy, cached) and the flag",
        "drop the flag",
    ),
}


def refused_flags(unknown: list[str], table: dict[str, tuple[str, str]] = REFUSED) -> list[str]:
    """One line per refused Megatron-LM flag of ``table`` among ``unknown`` (arguments argparse
    did not recognize), in order: ``--flag: refused: why. Fix: ...``. ``--flag=value`` counts
    as ``--flag``; other unknown arguments are left to argparse's message."""
    lines = []
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        if flag in table:
            why, fix = table[flag]
            lines.append(f"{flag}: refused: {why}. Fix: {fix}")
    return list(dict.fromkeys(lines))


def no_effect_flags(
    unknown: list[str], table: dict[str, tuple[str, str]] = PREPROCESS_NO_EFFECT
) -> tuple[list[str], list[str]]:
    """Take the flags of ``table`` given at their no-effect value (``--flag VALUE`` or
    ``--flag=VALUE``) out of ``unknown`` (arguments argparse did not recognize).

    Returns:
        (the other arguments, in order; one ``--flag VALUE: no effect: why`` line per flag
        taken out).
    """
    rest, notes, i = [], [], 0
    while i < len(unknown):
        flag, eq, value = unknown[i].partition("=")
        step = 1
        if not eq and i + 1 < len(unknown):
            value, step = unknown[i + 1], 2
        if flag in table and value == table[flag][0]:
            notes.append(f"{flag} {value}: no effect: {table[flag][1]}")
            i += step
        else:
            rest.append(unknown[i])
            i += 1
    return rest, list(dict.fromkeys(notes))

"""Model size, FLOPs and per-GPU memory of a configuration, before any GPU is touched.

Parameter counts sum the weight-role registry's list of the model's parameters
(:func:`megatron_gamma.model.roles.model_parameters`: every parameter megatron-core builds for
our local layer spec with its global shape, qk-layernorm weights, gate and router biases
included; ``tests/test_estimate.py`` compares it name by name with a built model), sharded as
each role's row says (:func:`~megatron_gamma.model.roles.shard_count`: TP rows or columns,
experts over EP x expert-TP, norms and the router replicated); ``--moe-layer-freq`` picks which
layers are MoE, the others are dense.

Per-GPU memory (bytes), on the pipeline stage that holds the most, with TP/PP/EP sharding as
megatron-core shards (norms and router replicated over TP):

- weights: 2 B/param in bf16 or fp16, 4 B in fp32;
- gradients: 4 B/param (megatron-core DDP accumulates fp32 ``main_grad``);
- optimizer: Adam moments 8 B/param, plus a 4 B fp32 master copy in bf16 or fp16 training;
  divided by the data-parallel size with the distributed optimizer;
- activations per micro-batch and layer (2 B per element in bf16 or fp16, else 4 B): the
  tensors our layer keeps for backward, s·b·(4h + n·d + 2·g·d + w_gate + w_gated + f_act)
  elements: norm inputs and outputs (4h), Q (n·d), K and V (2·g·d), the gate logits (w_gate = n·d
  elementwise, n headwise, 0 without a gate) and the gated attention output (w_gated = n·d with
  a gate), and the MLP's f_act = f·(3 with SwiGLU, else 2) (fc1 output and activation); for
  MoE, f_act = (top-k·f_e + f_s)·(3 or 2) + h (the widest layer: routed and shared experts plus
  the experts' s·b·h input); divided by TP, except that without sequence parallelism the 2h of
  norm/residual activations stay whole on every TP rank; only the layer inputs
  (s·b·h) plus one layer's worth with full recompute; times the micro-batches in flight on the
  first stage (PP with 1F1B); plus the logits and the fp32 softmax of the vocab-parallel
  cross-entropy, s·b·V/TP·(bytes + 4), and the backward transients at the output layer (the fp32
  logits gradient, s·b·V/TP·4, and the output weight gradient before DDP folds it into
  ``main_grad``, V·h/TP·4).

Sources: megatron-core DDP and DistributedOptimizer buffers; Korthikanti et al. (2022),
"Reducing Activation Recomputation in Large Transformer Models", for the activation accounting,
adapted to this model's layer (fused attention kernels: no s² term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_gamma.config import Config, moe_layer_pattern, trained_samples
from megatron_gamma.model.flops import train_flops_per_token
from megatron_gamma.model.roles import (
    Group,
    layer_parameters,
    model_parameters,
    role_of,
    shard_count,
)

ESTIMATE_WORLD = "--world-size N, or --slurm-nodes N with --slurm-gpus-per-node G"
"""The ``estimate`` flags that give the GPU count, for the fix of a missing or unfitting one."""


@dataclass
class ParamCounts:
    """Parameter counts of the whole (unsharded) model."""

    total: int
    embedding: int
    per_layer: int
    active: int

    def as_rows(self) -> list[tuple[str, str]]:
        """Table rows; the active-parameter row only where it differs from the total (MoE)."""
        rows = [
            ("parameters, total", f"{self.total:,}"),
            ("  embedding + output layer", f"{self.embedding:,}"),
            ("  per transformer layer", f"{self.per_layer:,}"),
        ]
        if self.active != self.total:
            rows.append(("  active per token (MoE top-k)", f"{self.active:,}"))
        return rows


def _layer_sizes(cfg: Config, moe: bool) -> tuple[int, int, int, int]:
    """(parameters, parameters on one GPU, expert parameters, expert parameters on one GPU) of
    one dense (``moe`` False) or MoE layer, summed over the registry's
    :func:`~megatron_gamma.model.roles.layer_parameters` with each role's sharding."""
    p = cfg.parallel
    layout = (p.tensor_model_parallel_size, p.expert_model_parallel_size)
    layout += (p.expert_tensor_parallel_size,)
    total = local = expert = expert_local = 0
    for name, shape in layer_parameters(cfg.model, moe):
        role = role_of(name)
        numel = math.prod(shape)
        total += numel
        local += numel // shard_count(role, *layout)
        if role.group is Group.EXPERT:
            expert += numel
            expert_local += numel // shard_count(role, *layout)
    return total, local, expert, expert_local


def _moe_layers(cfg: Config) -> list[int]:
    """1 (MoE) or 0 (dense) per layer (``--moe-layer-freq``; all 0 for a dense model)."""
    m = cfg.model
    if m.num_experts is None:
        return [0] * m.num_layers
    return moe_layer_pattern(m.moe_layer_freq, m.num_layers)


def count_parameters(cfg: Config, vocab_size: int) -> ParamCounts:
    """Parameter counts of every parameter the registry lists
    (:func:`~megatron_gamma.model.roles.model_parameters`) for a padded vocabulary of
    ``vocab_size``; ``per_layer`` is an MoE layer's where the model has one
    (``--moe-layer-freq`` may mix in dense layers); ``active`` counts top-k of the routed
    experts."""
    m = cfg.model
    pattern = _moe_layers(cfg)
    sizes = {k: _layer_sizes(cfg, bool(k)) for k in set(pattern)}
    total = sum(math.prod(shape) for _, shape in model_parameters(m, vocab_size, pattern))
    embedding = vocab_size * m.hidden_size * (2 if m.untie_embeddings_and_output_weights else 1)
    if m.position_embedding_type == "learned_absolute":
        embedding += m.max_position_embeddings * m.hidden_size
    active = total
    if m.num_experts is not None:
        inactive = sizes[1][2] * (m.num_experts - m.moe_router_topk) // m.num_experts
        active -= sum(pattern) * inactive
    return ParamCounts(total, embedding, sizes[max(pattern)][0], active)


def params_per_gpu(cfg: Config, vocab_size: int) -> dict[str, int]:
    """Parameters on one GPU of the first and of the last pipeline stage.

    Returns:
        {'first': ..., 'last': ..., 'expert': expert parameters among those of the heavier of
        the two}.
    """
    m, p = cfg.model, cfg.parallel
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    pattern = _moe_layers(cfg)
    sizes = {k: _layer_sizes(cfg, bool(k)) for k in set(pattern)}
    stage_layers = m.num_layers // pp
    first_layers, last_layers = pattern[:stage_layers], pattern[-stage_layers:]
    h = m.hidden_size
    emb = vocab_size * h // tp
    if m.position_embedding_type == "learned_absolute":
        emb += m.max_position_embeddings * h
    out = vocab_size * h // tp if m.untie_embeddings_and_output_weights or pp > 1 else 0
    first = sum(sizes[k][1] for k in first_layers) + emb + (out + h if pp == 1 else 0)
    last = sum(sizes[k][1] for k in last_layers) + out + h + (emb if pp == 1 else 0)
    heavier = first_layers if first >= last else last_layers
    return {"first": first, "last": last, "expert": sum(sizes[k][3] for k in heavier)}


def _activation_bytes(cfg: Config, vocab_size: int, num_microbatches: int) -> dict[str, float]:
    m, p, t = cfg.model, cfg.parallel, cfg.training
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    s, b = m.seq_length, t.micro_batch_size
    h, n, g, d = m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels
    nbytes = 2 if t.bf16 or t.fp16 else 4  # per activation element
    gate = {"none": 0, "elementwise": n * d, "headwise": n}[m.gated_attention]
    gated_out = n * d if m.gated_attention != "none" else 0
    if m.num_experts is None:
        f_act = m.ffn_hidden_size * (3 if m.swiglu else 2)
    else:  # the widest layer: an MoE layer's top-k experts and shared experts
        experts = m.moe_router_topk * m.moe_ffn_hidden_size
        experts += m.moe_shared_expert_intermediate_size or 0
        f_act = experts * (3 if m.swiglu else 2) + h
    per_layer = s * b * (4 * h + n * d + 2 * g * d + gate + gated_out + f_act) * nbytes
    per_layer_tp = per_layer / tp  # activations of sharded matmuls shrink with TP ...
    if not p.sequence_parallel:  # ... and the norm/residual ones only with SP
        per_layer_tp += s * b * 2 * h * nbytes * (tp - 1) / tp
    stage_layers = m.num_layers // pp
    in_flight = min(pp, num_microbatches) if pp > 1 else 1
    layer_inputs = s * b * h * nbytes / (tp if p.sequence_parallel else 1)
    full = stage_layers * per_layer_tp * in_flight
    recompute = (stage_layers * layer_inputs) * in_flight + per_layer_tp
    logits = s * b * vocab_size / tp * (nbytes + 4)
    # Backward transients at the output layer: the fp32 gradient of the logits and the output
    # layer's weight gradient before megatron-core's DDP hook folds it into main_grad.
    transient = s * b * vocab_size / tp * 4 + vocab_size * h / tp * 4
    extra = logits + transient
    return {"no_recompute": full + extra, "full_recompute": recompute + extra}


@dataclass
class MemoryEstimate:
    """Per-GPU memory in bytes."""

    weights: float
    gradients: float
    optimizer: float
    optimizer_distributed: float
    activations: float
    activations_recompute: float

    def total(self, distributed_optimizer: bool, recompute: bool) -> float:
        opt = self.optimizer_distributed if distributed_optimizer else self.optimizer
        act = self.activations_recompute if recompute else self.activations
        return self.weights + self.gradients + opt + act


def estimate_memory(cfg: Config, vocab_size: int, world_size: int) -> MemoryEstimate:
    """Per-GPU memory of the heavier pipeline stage (see module docstring).

    Raises:
        ConfigError: a layout that does not fit ``world_size`` (``validate_layout``).
    """
    from megatron_gamma.config import validate_layout

    dp = validate_layout(cfg, world_size, ESTIMATE_WORLD)
    t = cfg.training
    stage = params_per_gpu(cfg, vocab_size)
    n = max(stage["first"], stage["last"])
    expert = stage["expert"]
    par = cfg.parallel
    expert_dp = max(
        1,
        world_size
        // (
            par.pipeline_model_parallel_size
            * par.expert_model_parallel_size
            * par.expert_tensor_parallel_size
        ),
    )
    weight_b, opt_b = (2, 12) if t.bf16 or t.fp16 else (4, 8)
    dense = n - expert
    optimizer = n * opt_b
    optimizer_dist = dense * opt_b / dp + expert * opt_b / expert_dp
    microbatches = t.global_batch_size // (t.micro_batch_size * dp)
    act = _activation_bytes(cfg, vocab_size, microbatches)
    return MemoryEstimate(
        weights=n * weight_b,
        gradients=n * 4,
        optimizer=optimizer,
        optimizer_distributed=optimizer_dist,
        activations=act["no_recompute"],
        activations_recompute=act["full_recompute"],
    )


def memory_warning(
    cfg: Config, vocab_size: int, world_size: int, available: float, where: str
) -> str | None:
    """The warning for a run whose estimated memory per process (:func:`estimate_memory`, the
    configured optimizer and recompute) exceeds ``available``, or None.

    Args:
        cfg: the run config.
        vocab_size: the padded vocabulary (:func:`~megatron_gamma.model.vocab.model_vocab_size`).
        world_size: processes in the run.
        available: bytes one process may use: a GPU's memory, or on CPU the host's available
            memory divided among the processes on it.
        where: what ``available`` is, for the message (e.g. 'GPU 0's 80.0 GiB').
    """
    p, t = cfg.parallel, cfg.training
    mem = estimate_memory(cfg, vocab_size, world_size)
    need = mem.total(p.use_distributed_optimizer, t.recompute_granularity == "full")
    if need <= available:
        return None
    gib = 1024**3
    return (
        f"this run needs about {need / gib:.1f} GiB per process by megatron-gamma estimate "
        f"(activations {mem.activations / gib:.1f} GiB at --seq-length {cfg.model.seq_length} "
        f"and --micro-batch-size {t.micro_batch_size}), more than {where} "
        f"({available / gib:.1f} GiB): it may be killed for memory. Fix: lower --seq-length or "
        "--micro-batch-size, or use --recompute-granularity full (estimate shows each)"
    )


def report(cfg: Config, vocab_size: int, world_size: int, gpu_memory_gb: float) -> str:
    """The estimate as a table, with a warning line when the configured layout does not fit."""
    counts = count_parameters(cfg, vocab_size)
    mem = estimate_memory(cfg, vocab_size, world_size)
    gib = 1024**3
    t, p = cfg.training, cfg.parallel
    tokens_per_step = t.global_batch_size * cfg.model.seq_length
    total = trained_samples(t) * cfg.model.seq_length
    ramp = "" if t.rampup_batch_size is None else " (batch-size ramp-up included)"
    rows = counts.as_rows() + [
        ("training FLOPs per token", f"{train_flops_per_token(cfg, vocab_size):.4g}"),
        ("iterations", f"{t.train_iters:,}"),
        ("tokens per step / total", f"{tokens_per_step:,} / {total:.4g}{ramp}"),
        (
            "layout",
            f"TP {p.tensor_model_parallel_size} x PP {p.pipeline_model_parallel_size} x EP "
            f"{p.expert_model_parallel_size} on {world_size} GPU{'s' * (world_size != 1)}",
        ),
        ("weights per GPU", f"{mem.weights / gib:.2f} GiB"),
        ("gradients per GPU", f"{mem.gradients / gib:.2f} GiB"),
        ("optimizer per GPU", f"{mem.optimizer / gib:.2f} GiB"),
        ("optimizer per GPU, distributed", f"{mem.optimizer_distributed / gib:.2f} GiB"),
        ("activations per GPU", f"{mem.activations / gib:.2f} GiB"),
        ("activations per GPU, full recompute", f"{mem.activations_recompute / gib:.2f} GiB"),
    ]
    chosen = mem.total(p.use_distributed_optimizer, t.recompute_granularity == "full")
    rows.append(("total per GPU (configured)", f"{chosen / gib:.2f} GiB of {gpu_memory_gb:g} GiB"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if chosen > gpu_memory_gb * gib:
        lines.append(
            f"WARNING: {chosen / gib:.1f} GiB per GPU does not fit {gpu_memory_gb:g} GiB. Fix: "
            "raise --tensor-model-parallel-size or --pipeline-model-parallel-size, enable "
            "--use-distributed-optimizer or --recompute-granularity full, or lower "
            "--micro-batch-size"
        )
    return "\n".join(lines)

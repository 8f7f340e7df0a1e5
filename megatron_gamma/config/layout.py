"""Checks of the parallel layout that need the world size (run by
:func:`megatron_gamma.parallel.initialize`, ``estimate`` and ``submit``), and the virtual
pipeline stages a layout asks for."""

from __future__ import annotations

from typing import Optional

from megatron_gamma.config.errors import ConfigError, fail
from megatron_gamma.config.loading import Config


def virtual_stages(cfg: Config) -> Optional[int]:
    """Virtual pipeline chunks per pipeline rank (megatron-core's
    ``virtual_pipeline_model_parallel_size``), or None without virtual pipelining.

    Given directly by ``virtual_pipeline_model_parallel_size``, or derived as Megatron-LM does
    from ``num_layers_per_virtual_pipeline_stage``: num_layers / PP / layers per chunk
    (:func:`validate_layout` checks that the two agree when both are given)."""
    par = cfg.parallel
    per_chunk = par.num_layers_per_virtual_pipeline_stage
    if per_chunk is None:
        return par.virtual_pipeline_model_parallel_size
    return cfg.model.num_layers // par.pipeline_model_parallel_size // per_chunk


def check_moe_training(cfg: Config) -> None:
    """Refuse a layout megatron-core's MoE layer will not train: tensor parallelism without
    sequence parallelism. A config check, independent of the world size: ``pretrain`` runs it
    before :func:`validate_layout` (building such a model, e.g. to count its parameters, is
    fine, so it is not part of that check).

    Raises:
        ConfigError: ``num_experts`` set, ``tensor_model_parallel_size`` > 1 and no
            ``sequence_parallel``.
    """
    par = cfg.parallel
    if cfg.model.num_experts and par.tensor_model_parallel_size > 1 and not par.sequence_parallel:
        raise ConfigError(
            "sequence_parallel=False: megatron-core's MoE layer refuses to train with "
            f"tensor_model_parallel_size={par.tensor_model_parallel_size} without sequence "
            "parallelism. Fix: add --sequence-parallel"
        )


LAUNCHED_WORLD = "torchrun --nnodes x --nproc-per-node, or srun --ntasks"
"""How launched processes (``pretrain``, :func:`megatron_gamma.parallel.initialize`) get their
world size, for the fix of a layout that does not fit it."""


def validate_layout(cfg: Config, world_size: int, world_flags: str = LAUNCHED_WORLD) -> int:
    """Check the parallel layout against the world size; return the data-parallel size.

    Args:
        cfg: the config.
        world_size: the number of processes.
        world_flags: the flags that set ``world_size`` for the command that checks it, named in
            the fix of a world size that does not fit (``estimate``: ``--world-size``;
            ``submit``: ``--nodes x --gpus-per-node``).

    Raises:
        ConfigError: world size not divisible by TP x PP (or by EP x PP for MoE), layers not
            divisible among (virtual) pipeline stages, virtual_pipeline_model_parallel_size and
            num_layers_per_virtual_pipeline_stage both given and disagreeing, heads or experts
            not divisible by TP / EP, or global batch (or a ramp-up START / INCR) not divisible
            by micro batch x data-parallel size.
    """
    m, par = cfg.model, cfg.parallel
    tp, pp, ep = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.expert_model_parallel_size,
    )
    if world_size % (tp * pp):
        key, value = (
            ("pipeline_model_parallel_size", pp)
            if world_size % tp == 0
            else ("tensor_model_parallel_size", tp)
        )  # the one the world size cannot hold beside the other
        fail(
            key,
            value,
            f"TP x PP = {tp} x {pp} does not divide the world size {world_size}",
            f"launch a multiple of TP x PP processes ({world_flags}) or lower "
            "--tensor-model-parallel-size / --pipeline-model-parallel-size",
        )
    if m.num_layers % pp:
        fail(
            "pipeline_model_parallel_size",
            pp,
            f"does not divide num_layers={m.num_layers}",
            "choose a divisor of num_layers",
        )
    vpp = par.num_layers_per_virtual_pipeline_stage
    if vpp is not None and (m.num_layers // pp) % vpp:
        fail(
            "num_layers_per_virtual_pipeline_stage",
            vpp,
            f"does not divide the {m.num_layers // pp} layers of each pipeline stage",
            "choose a divisor of num_layers / pipeline_model_parallel_size",
        )
    chunks = par.virtual_pipeline_model_parallel_size
    if chunks is not None and (m.num_layers // pp) % chunks:
        fail(
            "virtual_pipeline_model_parallel_size",
            chunks,
            f"does not divide the {m.num_layers // pp} layers of each pipeline stage",
            "choose a divisor of num_layers / pipeline_model_parallel_size",
        )
    if chunks is not None and vpp is not None and chunks * vpp != m.num_layers // pp:
        fail(
            "virtual_pipeline_model_parallel_size",
            chunks,
            f"disagrees with num_layers_per_virtual_pipeline_stage={vpp}: {chunks} chunks x "
            f"{vpp} layers != the {m.num_layers // pp} layers of each pipeline stage",
            "give only one of the two flags",
        )
    if m.num_attention_heads % tp or m.num_query_groups % tp:
        fail(
            "tensor_model_parallel_size",
            tp,
            f"does not divide num_attention_heads={m.num_attention_heads} and "
            f"num_query_groups={m.num_query_groups}",
            "choose a TP size that divides both",
        )
    if ep > 1 and m.num_experts is None:
        fail("expert_model_parallel_size", ep, "needs an MoE model", "set --num-experts")
    if m.num_experts is not None:
        if m.num_experts % ep:
            fail(
                "expert_model_parallel_size",
                ep,
                f"does not divide num_experts={m.num_experts}",
                "choose a divisor of num_experts",
            )
        etp = par.expert_tensor_parallel_size
        if world_size % (etp * ep * pp):
            fail(
                "expert_model_parallel_size",
                ep,
                f"ETP x EP x PP = {etp} x {ep} x {pp} does not divide the world size {world_size}",
                f"launch a multiple of ETP x EP x PP processes ({world_flags})",
            )
        if ep == 1 and etp != tp:
            fail(
                "expert_tensor_parallel_size",
                etp,
                f"differs from tensor_model_parallel_size={tp} with expert_model_parallel_size=1: "
                "megatron-core then reduces expert gradients over the dense data-parallel group, "
                "so the expert copies drift apart",
                f"leave it unset (= {tp}) or use expert_model_parallel_size > 1",
            )
        if m.moe_ffn_hidden_size % etp:
            fail(
                "expert_tensor_parallel_size",
                etp,
                f"does not divide moe_ffn_hidden_size={m.moe_ffn_hidden_size}",
                "choose a divisor of moe_ffn_hidden_size",
            )
    dp = world_size // (tp * pp)
    mbs, gbs = cfg.training.micro_batch_size, cfg.training.global_batch_size
    if gbs % (mbs * dp):
        fail(
            "global_batch_size",
            gbs,
            f"not divisible by micro_batch_size x data-parallel size = {mbs} x {dp}",
            f"use a multiple of {mbs * dp}",
        )
    rampup = cfg.training.rampup_batch_size
    if rampup is not None and (rampup[0] % (mbs * dp) or rampup[1] % (mbs * dp)):
        fail(
            "rampup_batch_size",
            rampup,
            f"START and INCR must be multiples of micro_batch_size x data-parallel size = "
            f"{mbs} x {dp} (megatron-core's ramp-up consistency check)",
            f"use multiples of {mbs * dp}",
        )
    if pp > 1 and virtual_stages(cfg) is not None:
        _check_interleaved_microbatches(gbs, rampup, mbs * dp, pp)
    return dp


def _check_interleaved_microbatches(
    gbs: int, rampup: Optional[list[int]], per_microbatch: int, pp: int
) -> None:
    """megatron-core's interleaved pipeline schedule takes the micro-batches of a step in
    groups of PP (its default ``microbatch_group_size_per_vp_stage``) and refuses at the first
    step a count below PP or one that leaves a smaller last group: the count, global batch /
    (micro batch x data-parallel size), must be a multiple of PP, at every batch size a ramp-up
    reaches (trial 14: refused with megatron-core's raw message at the first step, after the
    model and the run directory were built).

    Raises:
        ConfigError: naming the global batch size (or the ramp-up), the count and the fix.
    """
    step = per_microbatch * pp
    if gbs % step:
        fail(
            "global_batch_size",
            gbs,
            f"gives {gbs // per_microbatch} micro-batches a step (global batch / (micro batch "
            f"x data-parallel size) = {gbs} / {per_microbatch}), and megatron-core's "
            f"interleaved pipeline schedule (virtual pipeline stages) needs a multiple of "
            f"pipeline_model_parallel_size={pp}",
            f"use a multiple of {step}, or drop the virtual pipeline stages",
        )
    if rampup is not None and (rampup[0] % step or rampup[1] % step):
        fail(
            "rampup_batch_size",
            rampup,
            f"START and INCR give batch sizes whose micro-batch counts are not all multiples of "
            f"pipeline_model_parallel_size={pp}, which megatron-core's interleaved pipeline "
            "schedule (virtual pipeline stages) needs",
            f"use multiples of {step}",
        )

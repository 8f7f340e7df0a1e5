"""The gamma-initialization rule: W ~ N(0, sigma^2), sigma = fan_in^-gamma.

Source: "Small Initialization Matters for Large Language Models", Methodology, *Initialization
Parameterization*: every weight matrix is drawn with sigma = d_in^-gamma, where d_in is the
matrix's input dimension; gamma = 0.5 is Xavier-like, gamma = 1 the recommended default
(*Optimal Initialization Scale*: the residual flow scales as d^(1-gamma), balanced at gamma = 1).

fan_in is the **unsharded** input dimension of each matrix, derived from the model config by the
matrix's role (the registry :mod:`megatron_gamma.model.roles`), never from the (possibly
tensor-parallel-sharded) tensor shape; the role also says which dimension megatron-core shards
and over which group (tensor-parallel, or expert tensor-parallel for experts). Biases start at
zero, norm weights at one (zero with ``--apply-layernorm-1p``, whose norms compute
x_hat * (1 + w)). Per-role gamma overrides (``--init-gamma-overrides fc2=0.75``)
replace ``--init-gamma`` for that role.

Embedding policy: an embedding lookup is a matrix product with a one-hot vector, so a literal
d_in would be the vocabulary size; we default to ``hidden`` (sigma = hidden^-gamma) because the
paper's residual-flow balance, update/embedding ~ d^(1-gamma), is stated against an embedding of
that scale. ``--embedding-fan-in vocab`` selects the literal reading.

Layout independence: each rank draws only its own shard, in place, on the device where the
parameter lives, from the counter-based generator :mod:`megatron_gamma.model.counter_rng`: the
value of global element i of a parameter is a function of (seed, global parameter name: global
layer and expert indices, i). The shard's global indices follow megatron-core's sharding
(contiguous chunks along the role's partition dimension; SwiGLU fc1 per half), so any
tensor/pipeline/expert layout gets the same weights, bit for bit, as a single rank on the same
device type (CPU vs CUDA: within 1 float32 ulp; see that module's contract), with O(shard) work
and no tensor of the global size on any rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from megatron.core import parallel_state

from megatron_gamma.config import Config
from megatron_gamma.model.counter_rng import fill_shard_normal_, stream_key
from megatron_gamma.model.roles import (
    ROLES,
    Group,
    WeightRole,
    fan_in,
    layer_and_expert,
    role_of,
    with_indices,
)


@dataclass(frozen=True)
class ParamInit:
    """How one parameter is initialized: its role, fan_in, gamma (None where gamma has no
    effect: ``--init-method normal``, :func:`drawn_init`) and sigma (0 for constants)."""

    role: str
    fan_in: int
    gamma: float | None
    sigma: float
    constant: float | None = None


def param_init(name: str, cfg: Config, vocab_size: int) -> ParamInit:
    """The initialization of parameter ``name`` under the gamma rule.

    Raises:
        ValueError: a parameter without a role (see ``roles.role_of``).
    """
    role = role_of(name)
    if role.name == "norm" and cfg.model.apply_layernorm_1p:
        return ParamInit(role.name, 0, 0.0, 0.0, constant=0.0)  # stores w - 1 (gain one)
    if not role.is_matrix:
        return ParamInit(role.name, 0, 0.0, 0.0, constant=role.constant)
    gamma = cfg.init.init_gamma_overrides.get(role.name, cfg.init.init_gamma)
    d_in = fan_in(role.name, cfg.model, cfg.init.embedding_fan_in, vocab_size)
    return ParamInit(role.name, d_in, gamma, float(d_in) ** (-gamma))


def drawn_init(name: str, cfg: Config, vocab_size: int) -> ParamInit:
    """How parameter ``name`` is drawn under the run's ``init_method``: the gamma rule's
    :func:`param_init` (per-role ``init_gamma_overrides`` and the embedding fan-in policy
    included), or for ``normal`` megatron-core's N(0, init_method_std), divided by
    sqrt(2 num_layers) for the registry's depth-scaled roles (attn_out, fc2, expert_fc2,
    shared_fc2), with gamma None: gamma has no effect there. The one place that says which
    sigma a parameter starts with (the init audit's expectation, the study report's
    sigma_emb^2 / epsilon).

    Raises:
        ValueError: a parameter without a role (see ``roles.role_of``).
    """
    init = param_init(name, cfg, vocab_size)
    if init.constant is not None or cfg.init.init_method != "normal":
        return init
    std = cfg.init.init_method_std
    if ROLES[init.role].depth_scaled:
        std /= math.sqrt(2.0 * cfg.model.num_layers)
    return replace(init, gamma=None, sigma=std)


def global_name(name: str, module: torch.nn.Module) -> str:
    """Layout-independent name: local layer and expert indices replaced by global ones.

    A tied output layer (on the last pipeline stage) takes the embedding's name, so both copies
    are drawn identically.
    """
    if name == "output_layer.weight" and getattr(module, "share_embeddings_and_output_weights", 0):
        return "embedding.word_embeddings.weight"
    local_layer, local_expert = layer_and_expert(name)
    if local_layer is None:
        return name
    layer = module.decoder.layers[local_layer]
    expert = None
    if local_expert is not None:
        first = parallel_state.get_expert_model_parallel_rank() * layer.mlp.num_local_experts
        expert = first + local_expert
    return with_indices(name, layer.layer_number - 1, expert)


def tp_size_rank(role: WeightRole) -> tuple[int, int]:
    """(size, rank) of the tensor-parallel group that shards weights of ``role``: the expert
    tensor-parallel group for expert roles, the tensor-parallel group otherwise (from the role,
    not from megatron-core's ``allreduce`` attribute, which is True for experts when EP = 1)."""
    if role.group is Group.EXPERT:
        return (
            parallel_state.get_expert_tensor_parallel_world_size(),
            parallel_state.get_expert_tensor_parallel_rank(),
        )
    return (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_rank(),
    )


def global_shape(param: torch.Tensor, role: WeightRole) -> tuple[int, ...]:
    """Unsharded shape of a (possibly tensor-parallel) parameter of ``role``."""
    shape = list(param.shape)
    if role.partition_dim is not None:
        shape[role.partition_dim] *= tp_size_rank(role)[0]
    return tuple(shape)


@torch.no_grad()
def apply_gamma_init(model: torch.nn.Module, cfg: Config, vocab_size: int) -> dict[str, ParamInit]:
    """Initialize every parameter of one GPTModel chunk by the gamma rule, in place.

    Args:
        model: a megatron-core GPTModel (one pipeline / virtual-pipeline chunk), unwrapped.
        cfg: the run config (model sizes, ``init``, ``training.seed``).
        vocab_size: padded vocabulary size the model was built with.

    Returns:
        {local parameter name: ParamInit} for the init audit.

    Raises:
        ValueError: a parameter whose role the rule does not know, or whose expert-ness the role
            table and megatron-core disagree on.
    """
    plan = {}
    for name, param in model.named_parameters():
        gname = global_name(name, model)
        init = param_init(gname, cfg, vocab_size)
        plan[name] = init
        if init.constant is not None:
            param.fill_(init.constant)
            continue
        role = ROLES[init.role]
        size, rank = tp_size_rank(role) if role.partition_dim is not None else (1, 0)
        fill_shard_normal_(
            param.data,
            global_shape(param, role),
            stream_key(cfg.training.seed, gname),
            init.sigma,
            partition_dim=role.partition_dim,
            parts=size,
            rank=rank,
            halves=cfg.model.swiglu and role.glu,
        )
    return plan

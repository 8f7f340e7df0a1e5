"""The gamma-initialization rule: W ~ N(0, sigma^2), sigma = fan_in^-gamma.

Source: "Small Initialization Matters for Large Language Models", Methodology, *Initialization
Parameterization*: every weight matrix is drawn with sigma = d_in^-gamma, where d_in is the
matrix's input dimension; gamma = 0.5 is Xavier-like, gamma = 1 the recommended default
(*Optimal Initialization Scale*: the residual flow scales as d^(1-gamma), balanced at gamma = 1).

fan_in is the **unsharded** input dimension of each matrix, derived from the model config by the
matrix's role (table in :mod:`megatron_gamma.model.roles`), never from the (possibly
tensor-parallel-sharded) tensor shape. Biases start at zero, norm weights at one. Per-role gamma
overrides (``--init-gamma-overrides fc2=0.75``) replace ``--init-gamma`` for that role.

Embedding policy: an embedding lookup is a matrix product with a one-hot vector, so a literal
d_in would be the vocabulary size; we default to ``hidden`` (sigma = hidden^-gamma) because the
paper's residual-flow balance, update/embedding ~ d^(1-gamma), is stated against an embedding of
that scale. ``--embedding-fan-in vocab`` selects the literal reading.

Layout independence: each parameter is drawn whole, in its global (unsharded) shape, from a CPU
generator seeded by (seed, global parameter name: global layer and expert indices), and the local
shard is cut from it the way megatron-core shards that parameter (contiguous chunks along the
partition dimension; SwiGLU fc1 per half). Any tensor/pipeline/expert layout therefore gets the
same weights, bit for bit, as a single rank.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch
from megatron.core import parallel_state

from megatron_gamma.config import Config
from megatron_gamma.model.roles import fan_in, role_of


@dataclass(frozen=True)
class ParamInit:
    """How one parameter is initialized: its role, fan_in, gamma and sigma (0 for constants)."""

    role: str
    fan_in: int
    gamma: float
    sigma: float
    constant: float | None = None


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def param_init(name: str, cfg: Config, vocab_size: int) -> ParamInit:
    """The initialization of parameter ``name`` under the gamma rule.

    Raises:
        ValueError: a parameter without a role (see ``roles.role_of``).
    """
    role = role_of(name)
    if role == "bias":
        return ParamInit(role, 0, 0.0, 0.0, constant=0.0)
    if role == "norm":
        return ParamInit(role, 0, 0.0, 0.0, constant=1.0)
    gamma = cfg.init.init_gamma_overrides.get(role, cfg.init.init_gamma)
    d_in = fan_in(role, cfg.model, cfg.init.embedding_fan_in, vocab_size)
    return ParamInit(role, d_in, gamma, float(d_in) ** (-gamma))


def global_name(name: str, module: torch.nn.Module) -> str:
    """Layout-independent name: local layer and expert indices replaced by global ones.

    A tied output layer (on the last pipeline stage) takes the embedding's name, so both copies
    are drawn identically.
    """
    if name == "output_layer.weight" and getattr(module, "share_embeddings_and_output_weights", 0):
        return "embedding.word_embeddings.weight"
    match = _LAYER.match(name)
    if not match:
        return name
    layer = module.decoder.layers[int(match.group(1))]
    name = f"decoder.layers.{layer.layer_number - 1}." + name[match.end() :]
    expert = _EXPERT.search(name)
    if expert:
        first = parallel_state.get_expert_model_parallel_rank() * layer.mlp.num_local_experts
        index = first + int(expert.group(1))
        name = name[: expert.start()] + f".local_experts.{index}." + name[expert.end() :]
    return name


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def expert_params(model: torch.nn.Module) -> frozenset[str]:
    """Local names of the parameters megatron-core builds as experts.

    Read from megatron-core's own metadata: the ``is_expert`` flag of the linear layer owning the
    parameter (set by SequentialMLP / GroupedMLP), never from the ``allreduce`` attribute, which
    megatron-core sets to True for experts when expert parallelism is 1.

    Raises:
        ValueError: an expert role (``roles.role_of``) on a non-expert module or the reverse,
            i.e. the role table and megatron-core disagree.
    """
    names = set()
    for mname, module in model.named_modules():
        if getattr(module, "is_expert", False):
            prefix = f"{mname}." if mname else ""
            names.update(prefix + pname for pname, _ in module.named_parameters(recurse=False))
    for name, _ in model.named_parameters():
        role_expert = _EXPERT.search(name) is not None
        if role_expert != (name in names):
            raise ValueError(
                f"parameter {name!r}: role table says expert={role_expert}, megatron-core's "
                f"module says is_expert={name in names}; fix model/roles.py"
            )
    return frozenset(names)


def tp_size_rank(param: torch.Tensor, expert: bool) -> tuple[int, int]:
    """(size, rank) of the tensor-parallel group sharding ``param``: megatron-core's expert
    tensor-parallel group (``--expert-tensor-parallel-size``) for experts, else the TP group."""
    if expert:
        return (
            parallel_state.get_expert_tensor_parallel_world_size(),
            parallel_state.get_expert_tensor_parallel_rank(),
        )
    return (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_rank(),
    )


def global_shape(param: torch.Tensor, expert: bool) -> tuple[int, ...]:
    """Unsharded shape of a (possibly tensor-parallel) parameter; ``expert`` as from
    :func:`expert_params`."""
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp_size_rank(param, expert)[0]
    return tuple(shape)


def _local_shard(
    full: torch.Tensor, param: torch.Tensor, glu: bool, role: str, expert: bool
) -> torch.Tensor:
    """Cut this rank's shard out of the global tensor as megatron-core shards it."""
    if not getattr(param, "tensor_model_parallel", False):
        return full
    size, rank = tp_size_rank(param, expert)
    dim = param.partition_dim
    if glu and role in ("fc1", "expert_fc1"):
        # SwiGLU fc1 is [gate; up] globally and [gate_shard; up_shard] on each rank.
        halves = full.chunk(2, dim=dim)
        return torch.cat([h.chunk(size, dim=dim)[rank] for h in halves], dim=dim)
    return full.chunk(size, dim=dim)[rank]


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
    experts = expert_params(model)
    for name, param in model.named_parameters():
        gname = global_name(name, model)
        init = param_init(gname, cfg, vocab_size)
        plan[name] = init
        if init.constant is not None:
            param.fill_(init.constant)
            continue
        gen = torch.Generator().manual_seed(_seed_for(cfg.training.seed, gname))
        expert = name in experts
        full = torch.randn(global_shape(param, expert), generator=gen, dtype=torch.float32)
        full.mul_(init.sigma)
        param.copy_(_local_shard(full, param, cfg.model.swiglu, init.role, expert))
    return plan

"""The gamma-initialization rule: W ~ N(0, sigma^2), sigma = fan_in^-gamma.

Source: "Small Initialization Matters for Large Language Models", Methodology, *Initialization
Parameterization*: every weight matrix is drawn with sigma = d_in^-gamma, where d_in is the
matrix's input dimension; gamma = 0.5 is Xavier-like, gamma = 1 the recommended default
(*Optimal Initialization Scale*: the residual flow scales as d^(1-gamma), balanced at gamma = 1).

fan_in is the **unsharded** input dimension of each matrix, derived from the model config by the
matrix's role, never from the (possibly tensor-parallel-sharded) tensor shape:

==================  ===================================  =========================================
role                parameter (megatron-core name)       fan_in
==================  ===================================  =========================================
embedding           embedding.word_embeddings.weight     hidden_size (policy ``hidden``, default)
                                                         or padded vocab size (policy ``vocab``)
position_embedding  embedding.position_embeddings.weight as ``embedding``
qkv                 self_attention.linear_qkv.weight     hidden_size (Q, K, V and the output-gate
                                                         rows of megatron-core's fused projection)
attn_out            self_attention.linear_proj.weight    num_attention_heads * kv_channels
fc1                 mlp.linear_fc1.weight                hidden_size (both SwiGLU halves)
fc2                 mlp.linear_fc2.weight                ffn_hidden_size
output              output_layer.weight                  hidden_size
bias                any *.bias                           zeros
norm                *layernorm.weight                    ones
==================  ===================================  =========================================

Embedding policy: an embedding lookup is a matrix product with a one-hot vector, so a literal
d_in would be the vocabulary size; we default to ``hidden`` (sigma = hidden^-gamma) because the
paper's residual-flow balance, update/embedding ~ d^(1-gamma), is stated against an embedding of
that scale. ``--embedding-fan-in vocab`` selects the literal reading.

Layout independence: each parameter is drawn whole, in its global (unsharded) shape, from a CPU
generator seeded by (seed, global parameter name), and the local tensor-parallel shard is cut from
it the way megatron-core shards that parameter. Any tensor/pipeline layout therefore gets the
same weights, bit for bit, as a single rank.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch
from megatron.core import parallel_state

from megatron_gamma.config import Config


@dataclass(frozen=True)
class ParamInit:
    """How one parameter is initialized: its role, fan_in, gamma and sigma (0 for constants)."""

    role: str
    fan_in: int
    gamma: float
    sigma: float
    constant: float | None = None


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def _role(name: str) -> str:
    """Role of a parameter from its megatron-core name (see the module table)."""
    if name.endswith(".bias"):
        return "bias"
    if name.endswith("layernorm.weight"):
        return "norm"
    table = (
        ("embedding.word_embeddings.weight", "embedding"),
        ("embedding.position_embeddings.weight", "position_embedding"),
        ("self_attention.linear_qkv.weight", "qkv"),
        ("self_attention.linear_proj.weight", "attn_out"),
        ("mlp.linear_fc1.weight", "fc1"),
        ("mlp.linear_fc2.weight", "fc2"),
        ("output_layer.weight", "output"),
    )
    for suffix, role in table:
        if name.endswith(suffix):
            return role
    raise ValueError(
        f"parameter {name!r} has no gamma-init role; add it to megatron_gamma.model.init"
    )


def fan_in_for(role: str, cfg: Config, vocab_size: int) -> int:
    """Unsharded fan_in of a matrix role (module table)."""
    m = cfg.model
    table = {
        "qkv": m.hidden_size,
        "attn_out": m.num_attention_heads * m.kv_channels,
        "fc1": m.hidden_size,
        "fc2": m.ffn_hidden_size,
        "output": m.hidden_size,
        "embedding": m.hidden_size if cfg.init.embedding_fan_in == "hidden" else vocab_size,
    }
    table["position_embedding"] = table["embedding"]
    return table[role]


def param_init(name: str, cfg: Config, vocab_size: int) -> ParamInit:
    """The initialization of parameter ``name`` under the gamma rule."""
    role = _role(name)
    if role == "bias":
        return ParamInit(role, 0, 0.0, 0.0, constant=0.0)
    if role == "norm":
        return ParamInit(role, 0, 0.0, 0.0, constant=1.0)
    gamma = cfg.init.init_gamma
    fan_in = fan_in_for(role, cfg, vocab_size)
    return ParamInit(role, fan_in, gamma, float(fan_in) ** (-gamma))


def global_name(name: str, module: torch.nn.Module) -> str:
    """Layout-independent name: the local layer index replaced by the global layer number.

    A tied output layer (on the last pipeline stage) takes the embedding's name, so both copies
    are drawn identically.
    """
    if name == "output_layer.weight" and getattr(module, "share_embeddings_and_output_weights", 0):
        return "embedding.word_embeddings.weight"
    match = _LAYER.match(name)
    if not match:
        return name
    layer = module.decoder.layers[int(match.group(1))]
    return f"decoder.layers.{layer.layer_number - 1}." + name[match.end() :]


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _global_shape(param: torch.Tensor, tp: int) -> tuple[int, ...]:
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp
    return tuple(shape)


def _local_shard(full: torch.Tensor, param: torch.Tensor, name: str, glu: bool) -> torch.Tensor:
    """Cut this TP rank's shard out of the global tensor as megatron-core shards it."""
    if not getattr(param, "tensor_model_parallel", False):
        return full
    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    dim = param.partition_dim
    if glu and name.endswith("mlp.linear_fc1.weight"):
        # SwiGLU fc1 is [gate; up] globally and [gate_shard; up_shard] on each rank.
        halves = full.chunk(2, dim=dim)
        return torch.cat([h.chunk(tp, dim=dim)[rank] for h in halves], dim=dim)
    return full.chunk(tp, dim=dim)[rank]


@torch.no_grad()
def apply_gamma_init(model: torch.nn.Module, cfg: Config, vocab_size: int) -> dict[str, ParamInit]:
    """Initialize every parameter of one GPTModel chunk by the gamma rule, in place.

    Args:
        model: a megatron-core GPTModel (one pipeline / virtual-pipeline chunk), unwrapped.
        cfg: the run config (model sizes, ``init.init_gamma``, ``init.embedding_fan_in``,
            ``training.seed``).
        vocab_size: padded vocabulary size the model was built with.

    Returns:
        {global parameter name: ParamInit} for the init audit.

    Raises:
        ValueError: a parameter whose role the rule does not know.
    """
    tp = parallel_state.get_tensor_model_parallel_world_size()
    plan = {}
    for name, param in model.named_parameters():
        gname = global_name(name, model)
        init = param_init(gname, cfg, vocab_size)
        plan[gname] = init
        if init.constant is not None:
            param.fill_(init.constant)
            continue
        gen = torch.Generator().manual_seed(_seed_for(cfg.training.seed, gname))
        full = torch.randn(_global_shape(param, tp), generator=gen, dtype=torch.float32)
        full.mul_(init.sigma)
        param.copy_(_local_shard(full, param, gname, cfg.model.swiglu))
    return plan

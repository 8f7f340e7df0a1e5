"""The weight-role registry: one name per weight of a megatron-core GPT model, flag to plot.

Every parameter of a GPTModel built by :mod:`megatron_gamma.model.builder` has exactly one role.
The gamma-init (:mod:`~megatron_gamma.model.init`), the init audit
(:mod:`~megatron_gamma.training.init_audit`), the live and offline diagnostics
(:mod:`~megatron_gamma.diagnostics.probes`), their TensorBoard tags (``stable_rank/attn_out/
layer_03``), ``analyze``'s plots and ``--init-gamma-overrides`` all read this table, so a role
has the same name everywhere. Adding a weight kind is one :class:`WeightRole` row.

role           parameter (megatron-core local-spec name)      fan_in
=============  =============================================  =====================================
embedding      embedding.word_embeddings.weight               hidden_size (policy 'hidden') or the
                                                              padded vocabulary (policy 'vocab')
pos_embedding  embedding.position_embeddings.weight           hidden_size (policy 'hidden') or
                                                              max_position_embeddings ('vocab')
qkv            self_attention.linear_qkv.weight               hidden_size
gate           self_attention.linear_gate.weight              hidden_size (gated attention)
attn_out       self_attention.linear_proj.weight              num_attention_heads * kv_channels
fc1            mlp.linear_fc1.weight                          hidden_size (both SwiGLU halves)
fc2            mlp.linear_fc2.weight                          ffn_hidden_size
router         mlp.router.weight                              hidden_size
expert_fc1     mlp.experts.local_experts.E.linear_fc1.weight  hidden_size
expert_fc2     mlp.experts.local_experts.E.linear_fc2.weight  moe_ffn_hidden_size
output         output_layer.weight                            hidden_size
bias           any *.bias                                     (zeros)
norm           *layernorm.weight                              (ones)
=============  =============================================  =====================================
=======
=============  =============================================  ==================  ====  ======
role           parameter (megatron-core local-spec name)      fan_in              TP    group
=============  =============================================  ==================  ====  ======
embedding      embedding.word_embeddings.weight               hidden or vocab     rows  dense
pos_embedding  embedding.position_embeddings.weight           hidden or max pos   -     dense
qkv            self_attention.linear_qkv.weight               hidden_size         rows  dense
gate           self_attention.linear_gate.weight              hidden_size         rows  dense
attn_out       self_attention.linear_proj.weight              heads * kv_channels cols  dense
fc1            mlp.linear_fc1.weight                          hidden_size         rows  dense
fc2            mlp.linear_fc2.weight                          ffn_hidden_size     cols  dense
router         mlp.router.weight                              hidden_size         -     dense
expert_fc1     mlp.experts.local_experts.E.linear_fc1.weight  hidden_size         rows  expert
expert_fc2     mlp.experts.local_experts.E.linear_fc2.weight  moe_ffn_hidden_size cols  expert
shared_fc1     mlp.shared_experts.linear_fc1.weight           hidden_size         rows  dense
shared_fc2     mlp.shared_experts.linear_fc2.weight           moe_shared_expert_  cols  dense
                                                              intermediate_size
output         output_layer.weight                            hidden_size         rows  dense
bias           any *.bias                                     (zeros)             -     dense
norm           *layernorm.weight, *.layer_norm_weight (TE)    (ones)              -     dense
=============  =============================================  ==================  ====  ======

Norm weights: ``input_layernorm``, ``pre_mlp_layernorm``, ``final_layernorm`` and, with
``--qk-layernorm``, ``self_attention.q_layernorm`` / ``k_layernorm`` (per head channel); on the
Transformer Engine backend the input norms are fused into the next projection
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``, and the gate's own
``linear_gate.layer_norm_weight``, :mod:`~megatron_gamma.model.te_backend`). TE's other
parameters carry the local names (``weight``, ``bias``). With ``--apply-layernorm-1p`` the
stored norm weight is w - 1 and starts at zero.

"TP" is the dimension of the global (out, in) matrix that megatron-core splits over the
tensor-parallel ranks of the role's group: the tensor-parallel group for dense weights, the
expert tensor-parallel group for experts (sizes of 1 leave the matrix whole). A role's *parts*
are the sub-matrices the diagnostics report separately, named ``role.part``: ``qkv.q``,
``qkv.k``, ``qkv.v`` (megatron-core's fused QKV rows, per query group ``[q heads, k, v]``) and,
with SwiGLU, ``fc1.gate`` / ``fc1.up`` (and the same for ``expert_fc1`` and ``shared_fc1``), the two
halves of fc1 (``[gate; up]`` on every rank's shard).

Pure Python (no torch or megatron-core import) so that the config can validate role names; the
part splitters use tensor methods only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Optional


class Group(str, Enum):
    """Which megatron-core parallel groups shard and replicate a weight."""

    DENSE = "dense"
    """Tensor-parallel group shards it; data-parallel ranks hold replicas."""
    EXPERT = "expert"
    """Expert tensor-parallel group shards it; expert-data-parallel ranks hold replicas; each
    expert-parallel rank holds different experts."""


def _qkv_parts(local: Any, m: Any, tp: int) -> dict[str, Any]:
    """Split a (local) fused QKV matrix, rows ``[q (heads/groups heads), k, v]`` per query
    group, into q, k and v.

    Raises:
        ValueError: the row count does not fit the config's layout.
    """
    hn, per_group = m.kv_channels, m.num_attention_heads // m.num_query_groups
    groups = m.num_query_groups // tp
    sizes = [per_group * hn, hn, hn]
    rows, cols = local.shape
    if rows != groups * sum(sizes):
        raise ValueError(
            f"linear_qkv has {rows} rows; the config's layout needs {groups * sum(sizes)} "
            f"({groups} query groups x (q {sizes[0]} + k {hn} + v {hn}))"
        )
    q, k, v = local.view(groups, sum(sizes), cols).split(sizes, dim=1)
    return {"q": q.reshape(-1, cols), "k": k.reshape(-1, cols), "v": v.reshape(-1, cols)}


def _glu_parts(local: Any, m: Any, tp: int) -> dict[str, Any]:
    """The SwiGLU halves ``[gate; up]`` of a (local) fc1 matrix; none without SwiGLU."""
    if not m.swiglu:
        return {}
    gate, up = local.chunk(2, dim=0)
    return {"gate": gate, "up": up}


FanIn = Callable[[Any, str, int], int]
"""fan_in(ModelConfig, embedding_fan_in policy, padded vocabulary size) -> unsharded d_in."""


def _embedding_fan_in(m: Any, policy: str, vocab: int) -> int:
    return m.hidden_size if policy == "hidden" else vocab


@dataclass(frozen=True)
class WeightRole:
    """One row of the registry.

    Attributes:
        name: the role's one name (flag, audit, tag, plot).
        pattern: regex that ``re.search`` matches against the megatron-core parameter name.
        title: display title in plots.
        fan_in: unsharded input dimension (the gamma rule's d_in); None for constants.
        constant: the value of constant-initialized parameters (biases 0, norms 1), else None.
        partition_dim: dimension of the global (out, in) matrix split over the group's
            tensor-parallel ranks, None when never split.
        group: :class:`Group` of the weight.
        depth_scaled: megatron-core's ``--init-method normal`` draws it with
            ``output_layer_init_method`` (std / sqrt(2 num_layers)).
        glu: with SwiGLU the matrix is ``[gate; up]`` and each half is sharded on its own (each
            rank holds ``[gate_shard; up_shard]``).
        parts: names of the diagnostics' sub-matrices, in display order.
        split: the diagnostics' sub-matrices ``(local, ModelConfig, tp) -> {part: tensor}``
            (empty: the matrix is reported whole).
    """

    name: str
    pattern: str
    title: str
    fan_in: Optional[FanIn] = None
    constant: Optional[float] = None
    partition_dim: Optional[int] = None
    group: Group = Group.DENSE
    depth_scaled: bool = False
    glu: bool = False
    parts: tuple[str, ...] = ()
    split: Optional[Callable[[Any, Any, int], dict[str, Any]]] = None

    @property
    def is_matrix(self) -> bool:
        """True for weights drawn by the gamma rule (and measured by the diagnostics)."""
        return self.fan_in is not None


REGISTRY: tuple[WeightRole, ...] = (
    WeightRole(
        "embedding",
        r"embedding\.word_embeddings\.weight$",
        "input embedding",
        _embedding_fan_in,
        partition_dim=0,
    ),
    WeightRole(
        "pos_embedding",
        r"embedding\.position_embeddings\.weight$",
        "position embedding",
        lambda m, p, v: m.hidden_size if p == "hidden" else m.max_position_embeddings,
    ),
    WeightRole(
        "qkv",
        r"self_attention\.linear_qkv\.weight$",
        "attention W_QKV",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
        parts=("q", "k", "v"),
        split=_qkv_parts,
    ),
    WeightRole(
        "gate",
        r"self_attention\.linear_gate\.weight$",
        "attention output gate W_G",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
    ),
    WeightRole(
        "attn_out",
        r"self_attention\.linear_proj\.weight$",
        "attention output W_O",
        lambda m, p, v: m.num_attention_heads * m.kv_channels,
        partition_dim=1,
        depth_scaled=True,
    ),
    WeightRole(
        "expert_fc1",
        r"mlp\.experts\.local_experts\.\d+\.linear_fc1\.weight$",
        "expert fc1",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
        group=Group.EXPERT,
        glu=True,
        parts=("gate", "up"),
        split=_glu_parts,
    ),
    WeightRole(
        "expert_fc2",
        r"mlp\.experts\.local_experts\.\d+\.linear_fc2\.weight$",
        "expert fc2",
        lambda m, p, v: m.moe_ffn_hidden_size,
        partition_dim=1,
        group=Group.EXPERT,
        depth_scaled=True,
    ),
    WeightRole(
        "router",
        r"mlp\.router\.weight$",
        "MoE router",
        lambda m, p, v: m.hidden_size,
    ),
    WeightRole(
        "shared_fc1",
        r"mlp\.shared_experts\.linear_fc1\.weight$",
        "shared expert fc1",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
        glu=True,
        parts=("gate", "up"),
        split=_glu_parts,
    ),
    WeightRole(
        "shared_fc2",
        r"mlp\.shared_experts\.linear_fc2\.weight$",
        "shared expert fc2",
        lambda m, p, v: m.moe_shared_expert_intermediate_size,
        partition_dim=1,
        depth_scaled=True,
    ),
    WeightRole(
        "fc1",
        r"mlp\.linear_fc1\.weight$",
        "MLP fc1",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
        glu=True,
        parts=("gate", "up"),
        split=_glu_parts,
    ),
    WeightRole(
        "fc2",
        r"mlp\.linear_fc2\.weight$",
        "MLP fc2",
        lambda m, p, v: m.ffn_hidden_size,
        partition_dim=1,
        depth_scaled=True,
    ),
    WeightRole(
        "output",
        r"output_layer\.weight$",
        "output layer",
        lambda m, p, v: m.hidden_size,
        partition_dim=0,
    ),
    WeightRole("bias", r"\.bias$", "bias", constant=0.0),
    WeightRole("norm", r"(layernorm\.weight|\.layer_norm_weight)$", "RMSNorm weight", constant=1.0),
)

ROLES: dict[str, WeightRole] = {r.name: r for r in REGISTRY}
"""Registry by role name."""

MATRIX_ROLES: tuple[str, ...] = tuple(r.name for r in REGISTRY if r.is_matrix)
"""Roles drawn by the gamma rule (valid keys of ``--init-gamma-overrides``)."""

_COMPILED = tuple((re.compile(r.pattern), r) for r in REGISTRY)


def role_of(name: str) -> WeightRole:
    """The registry row of a parameter, from its megatron-core name.

    A bias shares the sharding of its layer's weight: split along the same rows under a
    column-parallel layer (``partition_dim`` 0), whole under a row-parallel one, in the
    weight's group; the returned ``bias`` row carries that sharding.

    Raises:
        ValueError: a parameter that no row matches (add a row to :data:`REGISTRY`).
    """
    for pattern, role in _COMPILED:
        if pattern.search(name):
            if role.name == "bias":
                return _bias_of(name, role)
            return role
    raise ValueError(f"parameter {name!r} has no weight role; add a row to model/roles.py")


def _bias_of(name: str, bias: WeightRole) -> WeightRole:
    weight = name[: -len("bias")] + "weight"
    if not any(p.search(weight) for p, r in _COMPILED if r.is_matrix):
        return bias
    owner = role_of(weight)
    dim = 0 if owner.partition_dim == 0 else None
    return replace(bias, partition_dim=dim, group=owner.group)


def fan_in(role: str, model_cfg: Any, embedding_policy: str, vocab_size: int) -> int:
    """Unsharded fan-in of a matrix role.

    Args:
        role: one of :data:`MATRIX_ROLES`.
        model_cfg: ``Config.model``.
        embedding_policy: 'hidden' or 'vocab' (``--embedding-fan-in``).
        vocab_size: padded vocabulary size.

    Raises:
        KeyError: not a matrix role.
    """
    row = ROLES[role]
    if row.fan_in is None:
        raise KeyError(f"role {role!r} is constant-initialized and has no fan_in")
    return row.fan_in(model_cfg, embedding_policy, vocab_size)


def title(name: str) -> str:
    """Display title of a diagnostics name ``role`` or ``role.part`` (e.g. 'MLP fc1 (gate)')."""
    role, _, part = name.partition(".")
    base = ROLES[role].title if role in ROLES else role
    return f"{base} ({part})" if part else base


def sort_key(name: str) -> tuple[int, int]:
    """Display order of a diagnostics name ``role`` or ``role.part``: registry order, then the
    row's part order (unknown names last)."""
    role, _, part = name.partition(".")
    order = list(ROLES)
    if role not in ROLES:
        return (len(order), 0)
    parts = ROLES[role].parts
    return (order.index(role), parts.index(part) + 1 if part in parts else 0)

"""The weight-role registry: one name per weight of a megatron-core GPT model, flag to plot.

Every parameter of a GPTModel built by :mod:`megatron_gamma.model.builder` has exactly one role.
The gamma-init (:mod:`~megatron_gamma.model.init`), the init audit
(:mod:`~megatron_gamma.training.init_audit`), the live and offline diagnostics
(:mod:`~megatron_gamma.diagnostics.probes`), their TensorBoard tags (``stable_rank/attn_out/
layer_03``), ``analyze``'s plots and ``--init-gamma-overrides`` all read this table, so a role
has the same name everywhere. Adding a weight kind is one :class:`WeightRole` row.

=============  =============================================  ===================  =====  ======
role           parameter (megatron-core local-spec name)      fan_in               TP     group
=============  =============================================  ===================  =====  ======
embedding      embedding.word_embeddings.weight               hidden or vocab      rows   dense
pos_embedding  embedding.position_embeddings.weight           hidden or max pos    -      dense
qkv            self_attention.linear_qkv.weight               hidden_size          rows   dense
gate           self_attention.linear_gate.weight              hidden_size          rows   dense
attn_out       self_attention.linear_proj.weight              heads * kv_channels  cols   dense
expert_fc1     mlp.experts.local_experts.E.linear_fc1.weight  hidden_size          rows   expert
expert_fc2     mlp.experts.local_experts.E.linear_fc2.weight  moe_ffn_hidden_size  cols   expert
router         mlp.router.weight                              hidden_size          -      dense
shared_fc1     mlp.shared_experts.linear_fc1.weight           hidden_size          rows   dense
shared_fc2     mlp.shared_experts.linear_fc2.weight           shared expert width  cols   dense
fc1            mlp.linear_fc1.weight                          hidden_size          rows   dense
fc2            mlp.linear_fc2.weight                          ffn_hidden_size      cols   dense
output         output_layer.weight                            hidden_size          rows   dense
bias           any *.bias                                     (zeros)              owner  owner
norm           *layernorm.weight, *.layer_norm_weight (TE)    (ones)               -      dense
=============  =============================================  ===================  =====  ======

Norm weights: ``input_layernorm``, ``pre_mlp_layernorm``, ``final_layernorm`` and, with
``--qk-layernorm``, ``self_attention.q_layernorm`` / ``k_layernorm`` (per head channel); on the
Transformer Engine backend the input norms are fused into the next projection
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``, and the gate's own
``linear_gate.layer_norm_weight``, :mod:`~megatron_gamma.model.te_backend`). TE's other
parameters carry the local names (``weight``, ``bias``). With ``--apply-layernorm-1p`` the
stored norm weight is w - 1 and starts at zero. :data:`NORM_KINDS` names each norm weight's
sub-role, on either backend (:func:`norm_kind`), so that the activation probes find every norm,
the fused ones included.

"TP" is the dimension of the global (out, in) matrix that megatron-core splits over the
tensor-parallel ranks of the role's group: the tensor-parallel group for dense weights, the
expert tensor-parallel group for experts (sizes of 1 leave the matrix whole); a bias ("owner")
is split with its layer's rows and takes its layer's group. :func:`model_parameters` lists every
parameter of a configuration with its global shape, so that the estimator
(:mod:`megatron_gamma.estimate`) counts the registry's weights instead of its own table, and
:func:`parse_name` is the one reader of a name's role, layer and expert. A role's *parts*
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


def qkv_parts(local: Any, m: Any, tp: int = 1) -> dict[str, Any]:
    """Split a (local) fused QKV matrix, rows ``[q (heads/groups heads), k, v]`` per query
    group, into q, k and v (the diagnostics' parts and the Hugging Face q/k/v projections).

    Args:
        local: (rows, hidden) tensor, this rank's shard of ``linear_qkv.weight``.
        m: ``Config.model`` or any object with ``kv_channels``, ``num_attention_heads`` and
            ``num_query_groups``.
        tp: tensor-parallel size the shard was cut at.

    Returns:
        {'q': (groups/tp * heads/groups * kv_channels, hidden), 'k': (groups/tp * kv_channels,
        hidden), 'v': same as 'k'}, contiguous copies in query-group order.

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


def glu_parts(local: Any, m: Any, tp: int = 1) -> dict[str, Any]:
    """The SwiGLU halves ``[gate; up]`` of a (local) fc1 matrix (rows split in two, views);
    none without SwiGLU (``m.swiglu`` False)."""
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
        split=qkv_parts,
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
        split=glu_parts,
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
        split=glu_parts,
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
        split=glu_parts,
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


_INDEX = re.compile(r"^decoder\.layers\.(\d+)\.(?:.*?\.local_experts\.(\d+)\.)?")


@dataclass(frozen=True)
class ParamName:
    """A parameter name read by :func:`parse_name`.

    Attributes:
        role: registry role name.
        layer: the index after ``decoder.layers.`` (None outside the decoder layers).
        expert: the index after ``local_experts.`` (None outside the experts).
    """

    role: str
    layer: Optional[int]
    expert: Optional[int]


def parse_name(name: str) -> ParamName:
    """Role, layer and expert index of a megatron-core parameter name (local or global indices
    alike: the name's own numbers), e.g. ``decoder.layers.3.mlp.experts.local_experts.1.
    linear_fc2.weight`` -> ``ParamName('expert_fc2', 3, 1)``.

    Raises:
        ValueError: a name that no role matches (see :func:`role_of`).
    """
    layer, expert = layer_and_expert(name)
    return ParamName(role_of(name).name, layer, expert)


def layer_and_expert(name: str) -> tuple[Optional[int], Optional[int]]:
    """(layer, expert) indices in a parameter or module name, None where absent (the part of
    :func:`parse_name` that needs no role)."""
    match = _INDEX.match(name)
    if match is None:
        return None, None
    expert = match.group(2)
    return int(match.group(1)), None if expert is None else int(expert)


def with_indices(name: str, layer: int, expert: Optional[int] = None) -> str:
    """``name`` with its layer index (and, where given, its expert index) replaced; names
    outside the decoder layers come back unchanged."""
    match = _INDEX.match(name)
    if match is None:
        return name
    out = f"decoder.layers.{layer}." + name[match.end(1) + 1 :]
    if expert is None or match.group(2) is None:
        return out
    return re.sub(r"\.local_experts\.\d+\.", f".local_experts.{expert}.", out, count=1)


def layer_parameters(m: Any, moe: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of one transformer layer with the local spec, unsharded.

    Args:
        m: ``Config.model``.
        moe: an MoE layer (router, experts, shared experts) rather than a dense MLP.

    Returns:
        [(name below ``decoder.layers.L.``, global shape)], in megatron-core's build order; a
        linear layer's weight is (out, in), a norm weight (width,).
    """
    h, n, g, d = m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels
    bias = m.add_bias_linear
    glu = 2 if m.swiglu else 1
    attn = "self_attention"
    out: list[tuple[str, tuple[int, ...]]] = [("input_layernorm.weight", (h,))]

    def linear(prefix: str, rows: int, cols: int, has_bias: bool = bias) -> None:
        out.append((f"{prefix}.weight", (rows, cols)))
        if has_bias:
            out.append((f"{prefix}.bias", (rows,)))

    linear(f"{attn}.linear_proj", h, n * d)
    linear(f"{attn}.linear_qkv", n * d + 2 * g * d, h, bias or m.add_qkv_bias)
    if m.qk_layernorm:
        out += [(f"{attn}.q_layernorm.weight", (d,)), (f"{attn}.k_layernorm.weight", (d,))]
    if m.gated_attention != "none":
        width = n * d if m.gated_attention == "elementwise" else n
        linear(f"{attn}.linear_gate", width, h, m.gate_bias)
    out.append(("pre_mlp_layernorm.weight", (h,)))
    if not moe:
        linear("mlp.linear_fc1", glu * m.ffn_hidden_size, h)
        linear("mlp.linear_fc2", h, m.ffn_hidden_size)
        return out
    linear("mlp.router", m.num_experts, h)
    fe = m.moe_ffn_hidden_size
    for e in range(m.num_experts):
        linear(f"mlp.experts.local_experts.{e}.linear_fc1", glu * fe, h)
        linear(f"mlp.experts.local_experts.{e}.linear_fc2", h, fe)
    fs = m.moe_shared_expert_intermediate_size
    if fs is not None:
        linear("mlp.shared_experts.linear_fc1", glu * fs, h)
        linear("mlp.shared_experts.linear_fc2", h, fs)
    return out


def model_parameters(
    m: Any, vocab_size: int, moe_layers: list[int]
) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of the unsharded model (one pipeline stage, local spec): embedding
    (and learned positions), the layers, the final norm and, when untied, the output layer.

    Args:
        m: ``Config.model``.
        vocab_size: padded vocabulary size.
        moe_layers: 1 (MoE) or 0 (dense) per layer (``config.moe_layer_pattern``).

    Returns:
        [(megatron-core parameter name, global shape)]; :func:`role_of` names each one's role.
    """
    h = m.hidden_size
    out = [("embedding.word_embeddings.weight", (vocab_size, h))]
    if m.position_embedding_type == "learned_absolute":
        out.append(("embedding.position_embeddings.weight", (m.max_position_embeddings, h)))
    for i, moe in enumerate(moe_layers):
        out += [(f"decoder.layers.{i}.{k}", shape) for k, shape in layer_parameters(m, bool(moe))]
    out.append(("decoder.final_layernorm.weight", (h,)))
    if m.untie_embeddings_and_output_weights:
        out.append(("output_layer.weight", (vocab_size, h)))
    return out


def shard_count(role: WeightRole, tp: int, ep: int, etp: int) -> int:
    """Into how many pieces the layout cuts a parameter of ``role`` (a role row from
    :func:`role_of`, so a bias carries its layer's sharding): dense rows with a ``partition_dim``
    over the TP ranks; experts over the EP ranks (each holds its own experts) and, with a
    ``partition_dim``, the expert-TP ranks; everything else whole (replicated)."""
    split = role.partition_dim is not None
    if role.group is Group.EXPERT:
        return ep * (etp if split else 1)
    return tp if split else 1


NORM_KINDS: tuple[tuple[str, str], ...] = (
    ("input_layernorm", r"\.input_layernorm\.weight$|\.linear_(qkv|gate)\.layer_norm_weight$"),
    ("pre_mlp_layernorm", r"\.pre_mlp_layernorm\.weight$|\.linear_fc1\.layer_norm_weight$"),
    ("q_layernorm", r"\.q_layernorm\.weight$"),
    ("k_layernorm", r"\.k_layernorm\.weight$"),
    ("final_layernorm", r"(^|\.)final_layernorm\.weight$"),
)
"""Sub-roles of the 'norm' role: (name, pattern of its weight on the local or the Transformer
Engine backend). On TE the input norms live inside the next projection (``linear_qkv``,
``linear_gate`` and, in a dense MLP, ``linear_fc1``), whose forward input is the norm's input."""

_NORM_KINDS = tuple((re.compile(p), k) for k, p in NORM_KINDS)


def norm_kind(name: str) -> str:
    """The norm sub-role of a norm weight's parameter name (one of :data:`NORM_KINDS`).

    Raises:
        ValueError: ``name`` is not a norm weight the table knows (add a row).
    """
    for pattern, kind in _NORM_KINDS:
        if pattern.search(name):
            return kind
    raise ValueError(f"norm weight {name!r} has no norm kind; add a row to roles.NORM_KINDS")

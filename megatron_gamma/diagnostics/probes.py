"""Read diagnostics off megatron-core GPTModel chunks, shard-aware (used live and offline).

- :func:`weight_matrices` lists the weight matrices of a chunk by registry role
  (:mod:`megatron_gamma.model.roles`), global layer and global expert, split into the role's
  parts: megatron-core's fused QKV into ``qkv.q/qkv.k/qkv.v``, the SwiGLU ``fc1`` into
  ``fc1.gate/fc1.up`` (experts: ``expert_fc1.gate/expert_fc1.up``).
- :func:`weight_diagnostics` computes stable rank, top-direction share and condensation score of
  every matrix on the rank-local tensor-parallel shards: Frobenius norms and the subspace
  iteration of :func:`~megatron_gamma.diagnostics.spectral.top_singular_values_sq` are summed
  over the TP group (one all-reduce per iteration for all matrices), and only a fixed sample of
  rows is assembled for the cosine matrix. No rank ever holds a whole sharded matrix. Experts
  are sharded over the expert tensor-parallel group instead. Matrices held whole use
  :func:`~megatron_gamma.diagnostics.spectral.spectral_norm` (exact
  SVD below its size threshold).
- :class:`ActivationProbe` hooks core attention (q, k after RoPE: sink share), every RMSNorm
  (input: saturation) and every ``OutputGate`` module (inputs: gate statistics) for one forward
  pass, then merges the tensor-parallel pieces.

Metric keys are ``metric[/role][/layer_LL][/head_HH][/expert_EE]`` (:func:`metric_key`), layers
and experts numbered from 0 as in checkpoint names (``decoder.layers.LL``, ``local_experts.EE``
with the global expert index).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.distributed as dist

from megatron_gamma.diagnostics.attention import attention_sink_share
from megatron_gamma.diagnostics.condensation import (
    condensation_score_from_cosine,
    row_cosine_similarity,
    sample_rows,
)
from megatron_gamma.diagnostics.gates import GateSums, gate_sums
from megatron_gamma.diagnostics.norm import mean_square, saturation_from_mean_square
from megatron_gamma.diagnostics.spectral import spectral_norm, top_singular_values_sq
from megatron_gamma.model.gated_attention import OutputGate
from megatron_gamma.model.init import global_name
from megatron_gamma.model.roles import Group, layer_and_expert, norm_kind, role_of

CONDENSATION_ROWS = 128
"""Rows sampled per matrix for the condensation score: during training, and by ``analyze``
unless ``--condensation-rows`` says otherwise (one sample, so one value per tag)."""


def metric_key(
    metric: str,
    role: Optional[str] = None,
    layer: Optional[int] = None,
    head: Optional[int] = None,
    expert: Optional[int] = None,
) -> str:
    """``metric[/role][/layer_LL][/head_HH][/expert_EE]``, e.g. ``stable_rank/qkv.q/layer_03``.

    ``role`` is a registry role or ``role.part`` (:mod:`megatron_gamma.model.roles`), or a norm's
    attribute path for the norm metrics.
    """
    parts = [metric]
    if role:
        parts.append(role)
    if layer is not None:
        parts.append(f"layer_{layer:02d}")
    if head is not None:
        parts.append(f"head_{head:02d}")
    if expert is not None:
        parts.append(f"expert_{expert:02d}")
    return "/".join(parts)


def parse_metric_key(key: str) -> dict:
    """Inverse of :func:`metric_key`: {metric, role, layer, head, expert} (None where absent)."""
    parts = key.split("/")
    out = {"metric": parts[0], "role": None, "layer": None, "head": None, "expert": None}
    for part in parts[1:]:
        prefix, _, index = part.rpartition("_")
        if prefix in ("layer", "head", "expert") and index.isdigit():
            out[prefix] = int(index)
        else:
            out["role"] = part
    return out


@dataclass
class MatrixShard:
    """This rank's part of one weight matrix ``W`` (torch layout: (out, in)).

    Attributes:
        role: registry role or ``role.part`` (``qkv.q``, ``fc2``, ``expert_fc1.up``, ...).
        layer: global layer index from 0, None for embeddings and the output layer.
        local: the local block of W.
        partition_dim: 0 when W's rows are split over the tensor-parallel ranks of the role's
            group (rank r holds rows ``r*R .. (r+1)*R-1``), 1 when its columns are, None when
            this rank holds all of W.
        expert: global expert index for expert roles, else None.
        group: the role's :class:`~megatron_gamma.model.roles.Group`.
    """

    role: str
    layer: Optional[int]
    local: torch.Tensor
    partition_dim: Optional[int]
    expert: Optional[int] = None
    group: Group = Group.DENSE


def weight_matrices(model: torch.nn.Module, tp: int = 1, expert_tp: int = 1) -> list[MatrixShard]:
    """The weight matrices of one (unwrapped) megatron-core GPTModel chunk, by registry role.

    Every parameter whose role is a matrix (:data:`~megatron_gamma.model.roles.MATRIX_ROLES`)
    is listed, split into the role's parts (``qkv.q/k/v``, SwiGLU ``fc1.gate/up``), with its
    global layer and expert index. A tied output layer (a copy of the embedding) is skipped.

    Args:
        model: GPTModel (``chunk.module`` of a DDP-wrapped chunk).
        tp: tensor-parallel world size (shards dense roles).
        expert_tp: expert tensor-parallel world size (shards expert roles).

    Raises:
        ValueError: a parameter without a role, or a QKV matrix that does not fit the config.
    """
    cfg = model.config
    shared = getattr(model, "share_embeddings_and_output_weights", False)
    out: list[MatrixShard] = []
    for name, param in model.named_parameters():
        role = role_of(name)
        if not role.is_matrix or (role.name == "output" and shared):
            continue
        size = expert_tp if role.group is Group.EXPERT else tp
        pdim = role.partition_dim if size > 1 else None
        layer, expert = layer_and_expert(global_name(name, model))
        parts = role.split(param, _ModelView(cfg), size) if role.split else {}
        for part, local in parts.items() or [(None, param)]:
            label = f"{role.name}.{part}" if part else role.name
            out.append(MatrixShard(label, layer, local, pdim, expert, role.group))
    return out


class _ModelView:
    """The registry's model-config fields read off a megatron-core TransformerConfig."""

    def __init__(self, tcfg):
        self.kv_channels = tcfg.kv_channels
        self.num_attention_heads = tcfg.num_attention_heads
        self.num_query_groups = tcfg.num_query_groups
        self.swiglu = bool(tcfg.gated_linear_unit)


def aggregate_experts(values: dict[str, float]) -> dict[str, float]:
    """``values`` plus, for every per-expert key ``metric/role/layer_LL/expert_EE``, the mean
    over the layer's experts under ``metric/role/layer_LL``.

    Call it on the merged results (live: after gathering the expert-parallel ranks on rank 0).
    """
    groups: dict[str, list[float]] = {}
    for key, value in values.items():
        p = parse_metric_key(key)
        if p["expert"] is not None:
            layer_key = metric_key(p["metric"], p["role"], p["layer"], p["head"])
            groups.setdefault(layer_key, []).append(value)
    out = dict(values)
    out.update({k: sum(v) / len(v) for k, v in groups.items()})
    return dict(sorted(out.items()))


def _tp_info(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _all_reducer(group):
    def reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=group)
        return t

    return reduce


def sampled_rows(m: MatrixShard, rows: torch.Tensor, group) -> torch.Tensor:
    """Rows ``rows`` (global indices) of the full matrix, assembled on every TP rank.

    Each rank writes its part into a zero (k, cols) buffer; one all-reduce sums them.
    """
    tp, rank = _tp_info(group)
    local = m.local.detach().float()
    if m.partition_dim is None or tp == 1:
        return local[rows.to(local.device)]
    r, c = local.shape
    if m.partition_dim == 0:
        buf = torch.zeros(len(rows), c, device=local.device)
        own = (rows >= rank * r) & (rows < (rank + 1) * r)
        buf[own.to(local.device)] = local[(rows[own] - rank * r).to(local.device)]
    else:
        buf = torch.zeros(len(rows), c * tp, device=local.device)
        buf[:, rank * c : (rank + 1) * c] = local[rows.to(local.device)]
    dist.all_reduce(buf, group=group)
    return buf


def global_rows(m: MatrixShard, group) -> int:
    """Row count of the full matrix."""
    tp, _ = _tp_info(group)
    r = m.local.size(0)
    return r * tp if (m.partition_dim == 0 and tp > 1) else r


@torch.no_grad()
def weight_diagnostics(
    models: Iterable[torch.nn.Module],
    tp_group=None,
    *,
    expert_tp_group=None,
    max_rows: Optional[int] = CONDENSATION_ROWS,
    seed: int = 0,
) -> dict[str, float]:
    """Stable rank, top-direction share and condensation score of every weight matrix.

    Collective over the tensor-parallel group (and the expert tensor-parallel group): every TP
    rank of a pipeline stage must call it with its own chunks. Results are identical on those
    ranks. Expert matrices are reported per expert (``.../expert_EE``); their mean over a
    layer's experts comes from :func:`aggregate_experts` once all expert-parallel ranks'
    results are merged.

    Args:
        models: this rank's unwrapped GPTModel chunks.
        tp_group: tensor-parallel process group (None: single rank).
        expert_tp_group: expert tensor-parallel process group (None: experts held whole).
        max_rows: rows sampled for the condensation score (None: all rows).
        seed: seed of the row sample and of the subspace iteration.

    Returns:
        ``{metric_key: value}`` with metrics ``stable_rank`` (>= 1), ``top_share`` (in (0, 1],
        ``1 / stable_rank``) and ``condensation`` (mean |cos| over row pairs, in [0, 1]).
    """
    tp, _ = _tp_info(tp_group)
    etp, _ = _tp_info(expert_tp_group)
    mats = [m for model in models for m in weight_matrices(model, tp, etp)]
    out: dict[str, float] = {}
    for selected, group, size in (
        ([m for m in mats if m.partition_dim is None], None, 1),
        ([m for m in mats if m.partition_dim is not None and m.group is Group.DENSE], tp_group, tp),
        (
            [m for m in mats if m.partition_dim is not None and m.group is Group.EXPERT],
            expert_tp_group,
            etp,
        ),
    ):
        if not selected:
            continue
        fro = torch.stack([m.local.detach().double().pow(2).sum() for m in selected])
        if size == 1:
            sigma_sq = [spectral_norm(m.local, seed=seed) ** 2 for m in selected]
        else:
            reduce = _all_reducer(group)
            fro = reduce(fro)
            blocks = [m.local if m.partition_dim == 0 else m.local.T for m in selected]
            sigma_sq = top_singular_values_sq(blocks, reduce, seed=seed)
        for m, f, s in zip(selected, fro.tolist(), sigma_sq, strict=True):
            key = partial(metric_key, role=m.role, layer=m.layer, expert=m.expert)
            out[key("stable_rank")] = f / s if s > 0 else 0.0
            out[key("top_share")] = s / f if f > 0 else 0.0
            rows = sample_rows(global_rows(m, group), max_rows, seed)
            cos = row_cosine_similarity(sampled_rows(m, rows, group))
            out[key("condensation")] = condensation_score_from_cosine(cos)
    return out


def _norm_modules(model: torch.nn.Module) -> list[tuple[str, Optional[int], torch.nn.Module]]:
    """(norm sub-role, global layer or None, module whose forward input is the norm's input) of
    every norm weight of the registry (:func:`~megatron_gamma.model.roles.norm_kind`): the
    RMSNorm module, or on Transformer Engine the projection its norm is fused into."""
    out = []
    for name, _ in model.named_parameters():
        if role_of(name).name != "norm":
            continue
        layer, _ = layer_and_expert(global_name(name, model))
        out.append((norm_kind(name), layer, model.get_submodule(name.rpartition(".")[0])))
    return out


def _norm_eps(module: torch.nn.Module, x: torch.Tensor) -> float:
    eps = getattr(module, "eps", None)
    return float(eps) if eps is not None else float(torch.finfo(x.dtype).eps)


class ActivationProbe:
    """Capture activation diagnostics during one forward pass of the wrapped chunks.

    Use as a context manager around a forward pass (any schedule); each hooked module records
    only its first call. Then :meth:`results` (collective over ``tp_group``) returns::

        sink_share/layer_LL            mean over heads of the attention-sink share
        sink_share/layer_LL/head_HH    per global head (TP pieces concatenated in rank order)
        norm_saturated/ROLE[/layer_LL] share of tokens with sigma^2(h) <= 10 eps
        norm_eps_share/..., norm_log10_ms_p05|p50|p95/...   see diagnostics.norm
        gate_mean/layer_LL, gate_closed/layer_LL            from OutputGate modules, if any

    ROLE of a norm is its sub-role in the registry (:data:`~megatron_gamma.model.roles.
    NORM_KINDS`: ``input_layernorm``, ``pre_mlp_layernorm``, ``q_layernorm``, ``k_layernorm``,
    ``final_layernorm``), found by parameter name on either backend (on Transformer Engine the
    input norms are fused into the next projection, whose input is hooked). The per-token
    sigma^2 values and histograms are kept in :attr:`norm_stats` (a NormSaturation per norm
    key).

    Args:
        models: unwrapped GPTModel chunks of this rank.
        tp_group: tensor-parallel process group (None: single rank).
    """

    def __init__(self, models: Iterable[torch.nn.Module], tp_group=None):
        self.models = list(models)
        self.tp_group = tp_group
        self._handles: list = []
        self._sink: dict[int, torch.Tensor] = {}
        self._norm: dict[str, tuple[torch.Tensor, float, bool]] = {}
        self._gate: dict[int, GateSums] = {}
        self.norm_stats: dict = {}

    def __enter__(self) -> ActivationProbe:
        for model in self.models:
            for layer in model.decoder.layers:
                core = getattr(getattr(layer, "self_attention", None), "core_attention", None)
                if core is not None:
                    self._handles.append(
                        core.register_forward_pre_hook(
                            self._attention_hook(layer.layer_number - 1),
                            with_kwargs=True,
                        )
                    )
            for kind, layer, module in _norm_modules(model):
                self._handles.append(
                    module.register_forward_pre_hook(self._norm_hook((kind, layer)))
                )
            for layer in model.decoder.layers:
                gate = getattr(getattr(layer, "self_attention", None), "output_gate", None)
                if isinstance(gate, OutputGate):
                    self._handles.append(
                        gate.register_forward_hook(
                            self._gate_hook(layer.layer_number - 1), with_kwargs=True
                        )
                    )
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _attention_hook(self, layer: int):
        def hook(module, args, kwargs):
            if layer in self._sink:
                return
            names = ("query", "key", "value", "attention_mask")
            given = dict(zip(names, args, strict=False))
            given.update({k: v for k, v in kwargs.items() if k in names})
            scale = getattr(module, "softmax_scale", None)
            if scale is None:
                scale = getattr(getattr(module, "config", None), "softmax_scale", None)
            self._sink[layer] = attention_sink_share(
                given["query"], given["key"], scale, given.get("attention_mask")
            )

        return hook

    def _norm_hook(self, key):
        def hook(module, args):
            if key in self._norm:
                return
            x = args[0]
            seq_parallel = bool(getattr(getattr(module, "config", None), "sequence_parallel", 0))
            self._norm[key] = (
                mean_square(x).reshape(-1),
                _norm_eps(module, x),
                seq_parallel,
            )

        return hook

    def _gate_hook(self, layer: int):
        def hook(module, args, kwargs, output):
            if layer in self._gate:
                return
            logits = args[1] if len(args) > 1 else kwargs.get("gate_logits")
            if logits is not None:
                self._gate[layer] = gate_sums(logits=logits)

        return hook

    def results(self) -> dict[str, float]:
        """Merge over the tensor-parallel group (collective) and return the metric dict."""
        tp, _ = _tp_info(self.tp_group)
        out: dict[str, float] = {}
        for layer in sorted(self._sink):
            heads = self._sink[layer].double()
            if tp > 1:
                pieces = [torch.empty_like(heads) for _ in range(tp)]
                dist.all_gather(pieces, heads, group=self.tp_group)
                heads = torch.cat(pieces)
            out[metric_key("sink_share", None, layer)] = float(heads.mean())
            for h, value in enumerate(heads.tolist()):
                out[metric_key("sink_share", None, layer, h)] = value
        for key in sorted(self._norm, key=lambda k: (k[1] is None, k[1] or 0, k[0])):
            ms, eps, seq_parallel = self._norm[key]
            if tp > 1 and seq_parallel:
                pieces = [torch.empty_like(ms) for _ in range(tp)]
                dist.all_gather(pieces, ms.contiguous(), group=self.tp_group)
                ms = torch.cat(pieces)
            stats = saturation_from_mean_square(ms, eps)
            self.norm_stats[metric_key("norm", *key)] = stats
            for name, value in stats.scalars().items():
                out[metric_key(f"norm_{name}", *key)] = value
        for layer in sorted(self._gate):
            sums = self._gate[layer]
            if tp > 1:
                device = next(self.models[0].parameters()).device
                t = torch.tensor(
                    [sums.total, sums.closed, sums.count],
                    dtype=torch.float64,
                    device=device,
                )
                dist.all_reduce(t, group=self.tp_group)
                sums = GateSums(float(t[0]), int(t[1]), int(t[2]))
            stats = sums.stats()
            out[metric_key("gate_mean", None, layer)] = stats.mean
            out[metric_key("gate_closed", None, layer)] = stats.closed
        return out

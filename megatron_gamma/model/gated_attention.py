"""Gated attention: Y' = Y ⊙ sigmoid(X W_g) on every head's output, before the output projection.

Source: "Small Initialization Matters for Large Language Models", Methodology, *Architectural
Interventions* 2 (query-dependent gates on attention head outputs against the attention sink that
small initialization intensifies); granularities after Qiu et al., "Gated Attention for Large
Language Models" (arXiv 2505.06708):

- ``elementwise``: W_g is hidden -> heads x head_dim, one gate per output channel (the default:
  the best variant in that study, and the one megatron-core's ``attention_output_gate`` offers);
- ``headwise``: W_g is hidden -> heads, one scalar gate per head, broadcast over head_dim.

X is the layer's normalized input (the input of the QKV projection), Y the scaled-dot-product
attention output per head. Shapes: X (s, b, hidden); gate logits (s, b, np * head_dim) or
(s, b, np) where np is this tensor-parallel rank's heads; Y (s, b, np * head_dim).

Why a separate ``linear_gate`` instead of megatron-core's ``attention_output_gate`` (which fuses
elementwise gate rows into ``linear_qkv``): it expresses both granularities and a gate-only bias,
and the gate matrix is a parameter of its own for the gamma-init audit and the diagnostics. The
function is the same — ``tests/test_gated_attention.py`` checks our elementwise gate against
megatron-core's fused gate with copied weights. Wiring stays inside megatron-core's spec system:
:class:`GatedSelfAttention` subclasses ``SelfAttention`` only to supply the gate from
``linear_gate`` and to apply it with the fused op (``megatron_gamma.ops.sigmoid_gate``), through
megatron-core's own gate hooks (``get_query_key_value_tensors(output_gate=True)`` and
``_apply_output_gate``).
"""

from __future__ import annotations

import copy

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_gamma import ops


class OutputGate(torch.nn.Module):
    """y = o ⊙ sigmoid(g) per head (no parameters; a module so that hooks can observe gates).

    forward(core_attn_out (s, b, np * hn), gate_logits (s, b, np * hn) or (s, b, np))
    -> (s, b, np * hn) in core_attn_out's dtype.
    """

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim

    def forward(self, core_attn_out: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        s, b = core_attn_out.shape[:2]
        o = core_attn_out.view(s, b, self.heads, self.head_dim)
        per_head = gate_logits.shape[-1] == self.heads
        g = gate_logits.view(s, b, self.heads) if per_head else gate_logits.view(o.shape)
        return ops.sigmoid_gate(o, g).view(s, b, self.heads * self.head_dim)


class GatedSelfAttention(SelfAttention):
    """megatron-core ``SelfAttention`` plus a column-parallel gate projection ``linear_gate``.

    ``linear_gate`` is split by heads under tensor parallelism (its output is ordered head by head
    and megatron-core shards column-parallel outputs contiguously), so each rank gates exactly its
    own heads. It works with GQA, sequence parallelism (the projection all-gathers its input like
    ``linear_qkv``), activation recompute and pipeline stages, since it is an ordinary submodule.

    Args:
        config, submodules, layer_number, attn_mask_type, cp_comm_type, pg_collection: as for
            megatron-core ``SelfAttention``.
        granularity: 'elementwise' or 'headwise'.
        gate_bias: add a bias to the gate projection.
        gate_linear: the gate projection's class: megatron-core's ``ColumnParallelLinear`` on
            the local spec, ``TELayerNormColumnParallelLinear`` on the Transformer Engine spec,
            whose ``linear_qkv`` normalizes its input itself (:mod:`~.te_backend`).
    """

    def __init__(
        self,
        config: TransformerConfig,
        submodules: SelfAttentionSubmodules,
        layer_number: int,
        attn_mask_type: AttnMaskType = AttnMaskType.padding,
        cp_comm_type: str | None = None,
        pg_collection=None,
        granularity: str = "elementwise",
        gate_bias: bool = False,
        gate_linear: type = ColumnParallelLinear,
    ):
        if granularity not in ("elementwise", "headwise"):
            raise ValueError(f"granularity={granularity!r}: use 'elementwise' or 'headwise'")
        super().__init__(
            config=config,
            submodules=submodules,
            layer_number=layer_number,
            attn_mask_type=attn_mask_type,
            cp_comm_type=cp_comm_type,
            pg_collection=pg_collection,
        )
        self.granularity = granularity
        per_head = config.kv_channels if granularity == "elementwise" else 1
        self.linear_gate = gate_linear(
            config.hidden_size,
            config.num_attention_heads * per_head,
            config=config,
            init_method=config.init_method,
            gather_output=False,
            bias=gate_bias,
            skip_bias_add=False,
            is_expert=False,
            tp_group=self.pg_collection.tp,
        )
        self.output_gate = OutputGate(
            self.num_attention_heads_per_partition, self.hidden_size_per_attention_head
        )
        # megatron-core's forward asks get_query_key_value_tensors for a gate and calls
        # _apply_output_gate when its config says attention_output_gate; this module's own view
        # of the config says so, while linear_qkv above was built without fused gate rows.
        self.config = copy.copy(config)
        self.config.attention_output_gate = True

    def get_query_key_value_tensors(
        self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True
    ):
        """megatron-core's Q, K, V, plus the gate logits X W_g when ``output_gate``."""
        qkv = super().get_query_key_value_tensors(
            hidden_states, key_value_states, output_gate=False, split_qkv=split_qkv
        )
        if not output_gate:
            return qkv
        gate_logits, _ = self.linear_gate(hidden_states)
        return (*qkv, gate_logits)

    def _apply_output_gate(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.output_gate(x, gate)

"""Weight roles of a megatron-core GPT model and their unsharded fan-in (the gamma rule's d_in).

Pure Python (no megatron-core import) so that the config can validate role names.

=============  =============================================  =====================================
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
"""

from __future__ import annotations

import re

# role -> True for matrices drawn by the gamma rule, False for constants.
ROLES = {
    "embedding": True,
    "pos_embedding": True,
    "qkv": True,
    "gate": True,
    "attn_out": True,
    "fc1": True,
    "fc2": True,
    "router": True,
    "expert_fc1": True,
    "expert_fc2": True,
    "output": True,
    "bias": False,
    "norm": False,
}

_SUFFIXES = (
    (re.compile(r"embedding\.word_embeddings\.weight$"), "embedding"),
    (re.compile(r"embedding\.position_embeddings\.weight$"), "pos_embedding"),
    (re.compile(r"self_attention\.linear_qkv\.weight$"), "qkv"),
    (re.compile(r"self_attention\.linear_gate\.weight$"), "gate"),
    (re.compile(r"self_attention\.linear_proj\.weight$"), "attn_out"),
    (re.compile(r"mlp\.experts\.local_experts\.\d+\.linear_fc1\.weight$"), "expert_fc1"),
    (re.compile(r"mlp\.experts\.local_experts\.\d+\.linear_fc2\.weight$"), "expert_fc2"),
    (re.compile(r"mlp\.router\.weight$"), "router"),
    (re.compile(r"mlp\.linear_fc1\.weight$"), "fc1"),
    (re.compile(r"mlp\.linear_fc2\.weight$"), "fc2"),
    (re.compile(r"output_layer\.weight$"), "output"),
)


def role_of(name: str) -> str:
    """Role of a parameter from its megatron-core name.

    Raises:
        ValueError: a parameter the table does not know (add it here, with its fan-in).
    """
    if name.endswith(".bias"):
        return "bias"
    if name.endswith("layernorm.weight"):
        return "norm"
    for pattern, role in _SUFFIXES:
        if pattern.search(name):
            return role
    raise ValueError(f"parameter {name!r} has no gamma-init role; add it to model/roles.py")


def fan_in(role: str, model_cfg, embedding_policy: str, vocab_size: int) -> int:
    """Unsharded fan-in of a matrix role (module table).

    Args:
        role: one of the matrix roles of :data:`ROLES`.
        model_cfg: ``Config.model``.
        embedding_policy: 'hidden' or 'vocab'.
        vocab_size: padded vocabulary size.
    """
    m = model_cfg
    if embedding_policy == "hidden" and role in ("embedding", "pos_embedding"):
        return m.hidden_size
    if role == "embedding":
        return vocab_size
    if role == "pos_embedding":
        return m.max_position_embeddings
    table = {
        "qkv": m.hidden_size,
        "gate": m.hidden_size,
        "attn_out": m.num_attention_heads * m.kv_channels,
        "fc1": m.hidden_size,
        "fc2": m.ffn_hidden_size,
        "router": m.hidden_size,
        "expert_fc1": m.hidden_size,
        "expert_fc2": m.moe_ffn_hidden_size,
        "output": m.hidden_size,
    }
    return table[role]

"""Model FLOPs per token: the numerator of MFU in the training logs and of the size estimator.

Counts 2 FLOPs per multiply-accumulate of every matrix product, per token, forward pass:

- attention: QKV 2·h·(n·d + 2·g·d), gate 2·h·n·d (elementwise) or 2·h·n (headwise),
  output projection 2·n·d·h, and the score/value products 2·n·d·s (QKᵀ and AV, 2·2·n·d·s,
  halved by the causal mask);
- MLP: 2·h·f·(2 with SwiGLU, else 1) + 2·f·h; MoE: router 2·h·E plus top-k experts of width f_e
  and the shared experts of total width f_s; dense layers of ``--moe-layer-freq`` as MLP;
- output layer 2·h·V.

h hidden size, n heads, g query groups, d head dim, s sequence length, f ffn width, E experts,
V padded vocabulary. A training step costs 3x the forward (backward = 2x), 4x with full
activation recompute. Norms, softmax and elementwise ops are not counted (as in MFU practice).
"""

from __future__ import annotations

from megatron_gamma.config import Config, moe_layer_pattern


def forward_flops_per_token(cfg: Config, vocab_size: int) -> float:
    """Forward-pass FLOPs per token (see module docstring for the formula)."""
    m = cfg.model
    h, n, g, d = m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels
    s = m.seq_length
    attn = 2 * h * (n * d + 2 * g * d) + 2 * n * d * h + 2 * n * d * s
    if m.gated_attention == "elementwise":
        attn += 2 * h * n * d
    elif m.gated_attention == "headwise":
        attn += 2 * h * n
    glu = 2 if m.swiglu else 1
    dense = 2 * h * m.ffn_hidden_size * glu + 2 * m.ffn_hidden_size * h
    if m.num_experts is None:
        mlp = m.num_layers * dense
    else:
        fe, fs = m.moe_ffn_hidden_size, m.moe_shared_expert_intermediate_size or 0
        moe = 2 * h * m.num_experts + m.moe_router_topk * (2 * h * fe * glu + 2 * fe * h)
        moe += 2 * h * fs * glu + 2 * fs * h
        n_moe = sum(moe_layer_pattern(m.moe_layer_freq, m.num_layers))
        mlp = n_moe * moe + (m.num_layers - n_moe) * dense
    return float(m.num_layers * attn + mlp + 2 * h * vocab_size)


def train_flops_per_token(cfg: Config, vocab_size: int) -> float:
    """Forward + backward (+ recompute) FLOPs per token."""
    factor = 4 if cfg.training.recompute_granularity == "full" else 3
    return factor * forward_flops_per_token(cfg, vocab_size)

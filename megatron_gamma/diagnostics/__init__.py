"""The paper's diagnostics: pure functions on tensors, a training callback, offline analysis.

Paper sections: *Analysis Metrics*, *Scaling Limitation*, *Mechanistic Trajectory*,
*Token-Level Gains* of "Small Initialization Matters for Large Language Models".

==========================  ===============================================================
module                      measures
==========================  ===============================================================
``spectral``                stable rank ||W||_F^2 / ||W||_2^2, spectral norm
``condensation``            row-wise cosine matrix, condensation score, heatmap row order
``attention``               attention-sink share per head (exact softmax on q, k)
``norm``                    RMSNorm saturation: sigma^2(h) per token against eps
``gates``                   gated-attention gate statistics (mean, share below 0.1)
``tokens``                  per-token probabilities, Delta_sym, difficulty bins
``probes``                  the above on megatron-core GPTModel chunks, TP-shard aware
``callback``                ``--log-diagnostics-interval``: live logging during training
``analyze`` / ``compare``   offline: ``megatron-gamma analyze`` / ``compare`` (plots, CSV, JSON)
``plots``                   the PNG figures (matplotlib, Agg)
==========================  ===============================================================
"""

from megatron_gamma.diagnostics.attention import attention_sink_share
from megatron_gamma.diagnostics.condensation import (
    condensation_order,
    condensation_score,
    row_cosine_similarity,
    top_direction_share,
)
from megatron_gamma.diagnostics.gates import gate_statistics
from megatron_gamma.diagnostics.norm import rmsnorm_saturation
from megatron_gamma.diagnostics.spectral import spectral_norm, stable_rank
from megatron_gamma.diagnostics.tokens import (
    gap_by_difficulty,
    symmetric_gap,
    target_log_probs,
    token_difficulty,
)

__all__ = [
    "attention_sink_share",
    "condensation_order",
    "condensation_score",
    "gap_by_difficulty",
    "gate_statistics",
    "rmsnorm_saturation",
    "row_cosine_similarity",
    "spectral_norm",
    "stable_rank",
    "symmetric_gap",
    "target_log_probs",
    "token_difficulty",
    "top_direction_share",
]
